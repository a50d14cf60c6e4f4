#include "_common.h"
#include "atomics.h"

int32_t fulmar_get_int32_volatile(char *base, int64_t offset)
{
    return fa_load_i32(base + offset);
}

int64_t fulmar_get_int64_volatile(char *base, int64_t offset)
{
    return fa_load_i64(base + offset);
}

void fulmar_put_int32_ordered(char *base, int64_t offset, int32_t value)
{
    fa_store_i32(base + offset, value);
}

void fulmar_put_int64_ordered(char *base, int64_t offset, int64_t value)
{
    fa_store_i64(base + offset, value);
}

bool fulmar_compare_and_set_int32(char *base, int64_t offset, int32_t expected, int32_t desired)
{
    return fa_cas_i32(base + offset, expected, desired);
}

bool fulmar_compare_and_set_int64(char *base, int64_t offset, int64_t expected, int64_t desired)
{
    return fa_cas_i64(base + offset, expected, desired);
}

int32_t fulmar_get_and_add_int32(char *base, int64_t offset, int32_t delta)
{
    return fa_get_and_add_i32(base + offset, delta);
}

int64_t fulmar_get_and_add_int64(char *base, int64_t offset, int64_t delta)
{
    return fa_get_and_add_i64(base + offset, delta);
}

void fulmar_set_memory(char *base, int64_t offset, int64_t length, int32_t value)
{
    memset(base + offset, value, (size_t)length);
}
