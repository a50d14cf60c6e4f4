/* Shared by every native source: standard types and the inline atomics that
 * the C code uses directly (Python reaches them through atomics.h). */
#ifndef FULMAR_COMMON_H
#define FULMAR_COMMON_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define FULMAR_ALIGN(value, alignment) (((value) + ((alignment) - 1)) & ~((alignment) - 1))

/* Aeron's data frame header: the type and flag values every component reads. */
#define FULMAR_FRAME_TYPE_PAD 0
#define FULMAR_FRAME_TYPE_DATA 1
#define FULMAR_FLAG_BEGIN 0x80
#define FULMAR_FLAG_END 0x40
#define FULMAR_FLAG_UNFRAGMENTED 0xC0
#define FULMAR_LIKELY(x) __builtin_expect(!!(x), 1)
#define FULMAR_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Acquire loads pair with release stores: a reader that sees a frame length
 * written with a release store also sees every byte written before it. */
static inline int32_t fa_load_i32(const volatile void *addr)
{
    return __atomic_load_n((const volatile int32_t *)addr, __ATOMIC_ACQUIRE);
}

static inline int64_t fa_load_i64(const volatile void *addr)
{
    return __atomic_load_n((const volatile int64_t *)addr, __ATOMIC_ACQUIRE);
}

static inline void fa_store_i32(volatile void *addr, int32_t value)
{
    __atomic_store_n((volatile int32_t *)addr, value, __ATOMIC_RELEASE);
}

static inline void fa_store_i64(volatile void *addr, int64_t value)
{
    __atomic_store_n((volatile int64_t *)addr, value, __ATOMIC_RELEASE);
}

static inline bool fa_cas_i32(volatile void *addr, int32_t expected, int32_t desired)
{
    return __atomic_compare_exchange_n(
        (volatile int32_t *)addr, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static inline bool fa_cas_i64(volatile void *addr, int64_t expected, int64_t desired)
{
    return __atomic_compare_exchange_n(
        (volatile int64_t *)addr, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static inline int32_t fa_get_and_add_i32(volatile void *addr, int32_t delta)
{
    return __atomic_fetch_add((volatile int32_t *)addr, delta, __ATOMIC_SEQ_CST);
}

static inline int64_t fa_get_and_add_i64(volatile void *addr, int64_t delta)
{
    return __atomic_fetch_add((volatile int64_t *)addr, delta, __ATOMIC_SEQ_CST);
}

static inline void fa_release_fence(void)
{
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void fa_acquire_fence(void)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
}

/* Little-endian fields at any alignment (a datagram or a mapped file sits
 * wherever it is): memcpy, which compiles to a plain load. */
static inline int64_t fa_read_i64(const void *p)
{
    int64_t value;
    memcpy(&value, p, sizeof(value));
    return value;
}

static inline int32_t fa_read_i32(const void *p)
{
    int32_t value;
    memcpy(&value, p, sizeof(value));
    return value;
}

static inline int16_t fa_read_i16(const void *p)
{
    int16_t value;
    memcpy(&value, p, sizeof(value));
    return value;
}

static inline uint16_t fa_read_u16(const void *p)
{
    uint16_t value;
    memcpy(&value, p, sizeof(value));
    return value;
}

#endif
