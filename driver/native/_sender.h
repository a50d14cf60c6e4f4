/* Arithmetic shared by the sender's state machines (flow control, timing,
 * retransmission).  Private: not part of the cffi declarations. */
#ifndef FULMAR_SENDER_H
#define FULMAR_SENDER_H

#include <stdbool.h>
#include <stdint.h>

/* a + b, held at INT64_MAX / INT64_MIN instead of wrapping: for times that
 * are stored (an expiry, a deadline), where one too far to represent is
 * never reached.  Comparisons use the exact helpers below. */
static inline int64_t fulmar_saturating_add(int64_t a, int64_t b)
{
    int64_t sum;
    if (__builtin_add_overflow(a, b, &sum))
    {
        return b > 0 ? INT64_MAX : INT64_MIN;
    }
    return sum;
}

/* Exactly a + b < t, as "a + b - t < 0" with unbounded integers (a
 * saturated sum would be wrong where it equals t). */
static inline bool fulmar_sum_is_before(int64_t a, int64_t b, int64_t t)
{
    int64_t sum;
    if (__builtin_add_overflow(a, b, &sum))
    {
        return b < 0;
    }
    return sum < t;
}

/* Exactly a + b <= t. */
static inline bool fulmar_sum_is_at_or_before(int64_t a, int64_t b, int64_t t)
{
    int64_t sum;
    if (__builtin_add_overflow(a, b, &sum))
    {
        return b < 0;
    }
    return sum <= t;
}

/* Positions whose bits fit an int64 for every term id: a term count (int32)
 * times a term length of at most 2^31 plus an int32 offset and window. */
#define FULMAR_SENDER_MAX_POSITION_BITS 31

/* compute_position of fulmar/logbuffer.py: the term count wraps as an int32
 * (term ids wrap; a stream starting just below 2^31 keeps counting forwards)
 * and is then scaled in int64, multiplying rather than shifting, since a
 * left shift of a negative count is undefined in C.  bits_to_shift must be
 * from 0 to FULMAR_SENDER_MAX_POSITION_BITS. */
static inline int64_t fulmar_compute_position(
    int32_t term_id, int32_t term_offset, int32_t bits_to_shift, int32_t initial_term_id)
{
    int32_t term_count = (int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
    return (int64_t)term_count * ((int64_t)1 << bits_to_shift) + term_offset;
}

static inline int64_t fulmar_min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static inline int64_t fulmar_max_i64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

#endif
