#include <math.h>

#include "_common.h"
#include "image_state.h"
#include "rebuild.h"
#include "term.h"

/* Log buffer metadata (Aeron's LogBufferDescriptor), from its start. */
#define END_OF_STREAM_POSITION_OFFSET 128

#define TERM_MIN_LENGTH (64 * 1024)
#define TERM_MAX_LENGTH (1024 * 1024 * 1024)

/* A term id is 32 bits and the count of terms is taken modulo 2^32, so a
 * stream whose term ids wrap keeps counting forwards; no position a stream
 * can reach is beyond 2^31 terms.  Subscriber positions are clamped to it so
 * that no arithmetic on a position can overflow (a counter is written by a
 * client, and a client can be wrong). */
static inline int64_t max_position(int32_t term_length)
{
    return (int64_t)term_length << 31;
}

static inline int64_t add_saturating(int64_t a, int64_t b)
{
    int64_t sum;
    if (__builtin_add_overflow(a, b, &sum))
    {
        return b > 0 ? INT64_MAX : INT64_MIN;
    }
    return sum;
}

/* Wraps as Java's (int) cast does: the arithmetic is done unsigned. */
static inline int32_t term_id_at(int32_t initial_term_id, int64_t term_count)
{
    return (int32_t)(uint32_t)((uint64_t)(int64_t)initial_term_id + (uint64_t)term_count);
}

/* LogBufferDescriptor.computePosition: the term count is the wrapped
 * difference of the ids, so it is negative for an id before the initial one;
 * multiplied (not shifted) so a negative count is defined behaviour. */
static inline int64_t compute_position(const fulmar_image_state_t *s, int32_t term_id, int32_t term_offset)
{
    int32_t term_count = (int32_t)((uint32_t)term_id - (uint32_t)s->initial_term_id);
    return (int64_t)term_count * s->term_length + term_offset;
}

/* Floor division by the term length (positions below zero included, as
 * rounding towards minus infinity). */
static inline int64_t term_count_of(int64_t position, int32_t position_bits_to_shift)
{
    return position >> position_bits_to_shift;
}

static inline int32_t partition_of(int64_t term_count)
{
    int32_t index = (int32_t)(term_count % FULMAR_PARTITION_COUNT);
    return index < 0 ? index + FULMAR_PARTITION_COUNT : index;
}

/* Loss detector. */

int32_t fulmar_loss_detector_init_static(fulmar_loss_detector_t *d, int64_t delay_ns, int64_t retry_delay_ns)
{
    if (delay_ns < 0 || retry_delay_ns < 0)
    {
        return FULMAR_IMAGE_BAD_DELAY;
    }
    memset(d, 0, sizeof(*d)); /* no active gap */
    d->kind = FULMAR_DELAY_STATIC;
    d->delay_ns = delay_ns;
    d->retry_delay_ns = retry_delay_ns;
    return 0;
}

int32_t fulmar_loss_detector_init_multicast(
    fulmar_loss_detector_t *d, int64_t max_backoff_ns, int32_t group_size, uint64_t seed)
{
    if (max_backoff_ns <= 0 || group_size < 1)
    {
        return FULMAR_IMAGE_BAD_DELAY;
    }
    memset(d, 0, sizeof(*d)); /* no active gap */
    d->kind = FULMAR_DELAY_MULTICAST;
    d->group_size = group_size;
    d->max_backoff_ns = max_backoff_ns;
    /* Nonnenmacher and Biersack's optimal multicast feedback, as Aeron draws
     * it: delay = T/lambda * ln(x * (e^lambda - 1) * T/lambda), x uniform in
     * [lambda / (T (e^lambda - 1)), that + lambda/T), so the logarithm's
     * argument runs from 1 to e^lambda and the delay from 0 to T. */
    double lambda = log((double)group_size) + 1.0;
    double backoff = (double)max_backoff_ns;
    d->rand_max = lambda / backoff;
    d->base_x = lambda / (backoff * (exp(lambda) - 1.0));
    d->constant_t = backoff / lambda;
    d->factor_t = (exp(lambda) - 1.0) * d->constant_t;
    d->rng_state = seed;
    return 0;
}

/* splitmix64: one 64-bit state, every seed a good sequence, and each
 * detector its own, so no receiver's draws depend on another's. */
static uint64_t next_random(fulmar_loss_detector_t *d)
{
    uint64_t z = (d->rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int64_t fulmar_loss_detector_multicast_delay_ns(const fulmar_loss_detector_t *d, double uniform)
{
    double x = uniform * d->rand_max + d->base_x;
    int64_t delay = (int64_t)(d->constant_t * log(x * d->factor_t));
    /* Rounding can land a hair outside [0, T) at the ends of the range. */
    if (delay < 0)
    {
        return 0;
    }
    return delay < d->max_backoff_ns ? delay : d->max_backoff_ns - 1;
}

int64_t fulmar_loss_detector_generate_delay_ns(fulmar_loss_detector_t *d)
{
    if (FULMAR_DELAY_MULTICAST == d->kind)
    {
        /* The top 53 bits: a double uniform in [0, 1). */
        double uniform = (double)(next_random(d) >> 11) * (1.0 / 9007199254740992.0);
        return fulmar_loss_detector_multicast_delay_ns(d, uniform);
    }
    return d->delay_ns;
}

int64_t fulmar_loss_detector_retry_delay_ns(fulmar_loss_detector_t *d)
{
    /* Multicast retries draw afresh: the suppression works for them too. */
    return FULMAR_DELAY_MULTICAST == d->kind ? fulmar_loss_detector_generate_delay_ns(d) : d->retry_delay_ns;
}

int32_t fulmar_loss_detector_scan(
    fulmar_loss_detector_t *d, const char *log, int32_t term_length, int32_t position_bits_to_shift,
    int32_t initial_term_id, int64_t rebuild_position, int64_t hwm_position, int64_t now_ns,
    int64_t *new_rebuild_position, fulmar_nak_t *nak_out)
{
    *new_rebuild_position = rebuild_position;
    if (rebuild_position >= hwm_position)
    {
        d->gap_active = 0;
        return 0;
    }

    int64_t term_count = term_count_of(rebuild_position, position_bits_to_shift);
    int64_t term_begin = term_count * term_length;
    int32_t rebuild_offset = (int32_t)(rebuild_position - term_begin);
    /* Within the high-water mark's term, scan up to it; in an earlier term
     * everything up to the term's end was sent. */
    int32_t limit_offset = term_count == term_count_of(hwm_position, position_bits_to_shift)
        ? (int32_t)(hwm_position - term_begin) : term_length;

    int32_t gap_length;
    int32_t offset = fulmar_term_scan_for_gap(
        log, term_length, partition_of(term_count), rebuild_offset, limit_offset, &gap_length);
    if (offset < 0)
    {
        return offset; /* a rebuild position off the frame alignment: nothing scanned */
    }
    *new_rebuild_position = term_begin + offset;
    if (0 == gap_length)
    {
        d->gap_active = 0;
        return 0;
    }

    int32_t result = 0;
    int32_t term_id = term_id_at(initial_term_id, term_count);
    /* A new gap, or the old one partly filled at either end (Aeron compares
     * the length too): a fresh initial delay. */
    if (!d->gap_active || d->gap_term_id != term_id || d->gap_term_offset != offset || d->gap_length != gap_length)
    {
        d->gap_active = 1;
        d->gap_term_id = term_id;
        d->gap_term_offset = offset;
        d->gap_length = gap_length;
        d->deadline_ns = add_saturating(now_ns, fulmar_loss_detector_generate_delay_ns(d));
        result |= FULMAR_LOSS_GAP_FOUND;
    }
    if (now_ns >= d->deadline_ns)
    {
        nak_out->term_id = term_id;
        nak_out->term_offset = offset;
        nak_out->length = gap_length;
        d->deadline_ns = add_saturating(now_ns, fulmar_loss_detector_retry_delay_ns(d));
        result |= FULMAR_LOSS_NAK_DUE;
    }
    return result;
}

/* Image state. */

static bool is_valid_term_length(int32_t term_length)
{
    return term_length >= TERM_MIN_LENGTH && term_length <= TERM_MAX_LENGTH &&
        0 == (term_length & (term_length - 1));
}

int32_t fulmar_image_state_init(
    fulmar_image_state_t *s, char *log, int32_t term_length, int32_t initial_term_id, int32_t session_id,
    int32_t stream_id, int32_t active_term_id, int32_t term_offset, int64_t now_ns,
    int32_t initial_window_length, int64_t status_message_timeout_ns, int64_t image_liveness_timeout_ns)
{
    if (!is_valid_term_length(term_length))
    {
        return FULMAR_IMAGE_BAD_TERM_LENGTH;
    }
    if (term_offset < 0 || term_offset >= term_length || 0 != (term_offset & (FULMAR_FRAME_ALIGNMENT - 1)))
    {
        return FULMAR_IMAGE_BAD_TERM_OFFSET;
    }
    memset(s, 0, sizeof(*s));
    s->log = log;
    s->term_length = term_length;
    s->position_bits_to_shift = __builtin_ctz((unsigned)term_length);
    s->initial_term_id = initial_term_id;
    s->session_id = session_id;
    s->stream_id = stream_id;
    int64_t join_position = compute_position(s, active_term_id, term_offset);
    if (join_position < 0)
    {
        return FULMAR_IMAGE_BAD_TERM_ID;
    }

    /* Aeron's static window: never more than half a term, so a sender can
     * never write into the partition subscribers are still reading. */
    s->receiver_window_length = term_length / 2 < initial_window_length ? term_length / 2 : initial_window_length;
    s->status_message_timeout_ns = status_message_timeout_ns;
    s->image_liveness_timeout_ns = image_liveness_timeout_ns;
    fulmar_loss_detector_init_static(
        &s->loss_detector, FULMAR_NAK_UNICAST_DELAY_DEFAULT_NS,
        (int64_t)FULMAR_NAK_UNICAST_DELAY_DEFAULT_NS * FULMAR_NAK_UNICAST_RETRY_DELAY_RATIO_DEFAULT);

    s->hwm_position = join_position;
    s->rebuild_position = join_position;
    s->end_of_stream_position = -1;
    s->packet_eos_position = -1;
    s->clean_position = join_position;
    s->time_of_last_packet_ns = now_ns;
    s->is_rebuilding = 1;
    s->sending_eos_sm = 0;

    /* The first SM is due at once: it is what tells the sender the image exists. */
    s->next_sm_position = join_position;
    s->sm_pending = 1;
    s->sm_deadline_ns = now_ns;
    s->last_sm_position = join_position;
    s->last_overrun_threshold = join_position + term_length / 2;
    s->nak_pending = 0;
    s->pending_nak.session_id = session_id;
    s->pending_nak.stream_id = stream_id;
    return 0;
}

int32_t fulmar_image_state_use_static_delays(fulmar_image_state_t *s, int64_t delay_ns, int64_t retry_delay_ns)
{
    return fulmar_loss_detector_init_static(&s->loss_detector, delay_ns, retry_delay_ns);
}

int32_t fulmar_image_state_use_multicast_delays(
    fulmar_image_state_t *s, int64_t max_backoff_ns, int32_t group_size, uint64_t seed)
{
    return fulmar_loss_detector_init_multicast(&s->loss_detector, max_backoff_ns, group_size, seed);
}

static int32_t window_verdict(fulmar_image_state_t *s, int64_t position, int32_t length, bool is_heartbeat)
{
    /* Over-run: past half a term beyond the last SM, the packet's partition
     * could still be in use by subscribers (a sender that honours our window
     * never gets there). */
    int64_t proposed_position = is_heartbeat ? position : position + length;
    if (proposed_position > s->last_overrun_threshold)
    {
        s->flow_control_over_runs++;
        return FULMAR_VERDICT_OVER_RUN;
    }
    if (is_heartbeat)
    {
        /* A heartbeat writes nothing, so one from up to a term behind still
         * counts as a sign of life. */
        int64_t oldest = s->last_sm_position - s->term_length;
        if (position >= (oldest > 0 ? oldest : 0))
        {
            return FULMAR_VERDICT_HEARTBEAT;
        }
    }
    else if (position >= s->last_sm_position)
    {
        return FULMAR_VERDICT_DATA;
    }
    /* Under-run: data subscribers have already consumed (its partition may
     * be cleaned or reused), or a stale heartbeat. */
    s->flow_control_under_runs++;
    return FULMAR_VERDICT_UNDER_RUN;
}

static void record(fulmar_image_state_t *s, int64_t position, int32_t length, int64_t now_ns, bool is_heartbeat, bool is_eos)
{
    s->time_of_last_packet_ns = now_ns;
    /* A heartbeat says how far the sender has sent, so loss at the tail of a
     * burst shows up as a gap below the high-water mark. */
    int64_t end_position = is_heartbeat ? position : position + length;
    if (end_position > s->hwm_position)
    {
        s->hwm_position = end_position;
    }
    if (is_heartbeat)
    {
        s->heartbeats_received++;
    }
    if (is_eos)
    {
        fulmar_image_state_end_stream(s, end_position);
    }
}

int32_t fulmar_image_state_insert_packet(
    fulmar_image_state_t *s, int32_t term_id, int32_t term_offset, const char *datagram, int32_t length,
    int64_t now_ns, int32_t record_eos)
{
    s->packet_eos_position = -1;
    if (length < FULMAR_HEADER_LENGTH || term_offset < 0 || term_offset >= s->term_length)
    {
        s->invalid_packets++;
        return FULMAR_VERDICT_INVALID;
    }
    int32_t frame_length = fa_read_i32(datagram);
    uint8_t flags = (uint8_t)datagram[5];
    bool is_heartbeat = FULMAR_HEADER_LENGTH == length && 0 == frame_length;
    int64_t position = compute_position(s, term_id, term_offset);
    int32_t verdict = window_verdict(s, position, length, is_heartbeat);
    /* A packet wholly behind the rebuild position is a duplicate of data
     * already complete there: nothing to write (and nothing a forged frame
     * boundary could overwrite).  The window put a DATA packet at or past
     * the last SM's position, so it is not negative. */
    if (FULMAR_VERDICT_DATA == verdict && position + length > s->rebuild_position)
    {
        int32_t index = partition_of(term_count_of(position, s->position_bits_to_shift));
        if (fulmar_term_insert(s->log, s->term_length, index, term_offset, datagram, length) < 0)
        {
            s->invalid_packets++;
            return FULMAR_VERDICT_INVALID;
        }
    }
    if (FULMAR_VERDICT_DATA == verdict || FULMAR_VERDICT_HEARTBEAT == verdict)
    {
        bool is_eos = 0 != (flags & FULMAR_DATA_EOS_FLAG);
        if (is_eos)
        {
            s->packet_eos_position = is_heartbeat ? position : position + length;
        }
        record(s, position, length, now_ns, is_heartbeat, is_eos && record_eos);
    }
    return verdict;
}

int32_t fulmar_image_state_on_data(
    fulmar_image_state_t *s, int32_t term_id, int32_t term_offset, int32_t length, int64_t now_ns,
    int32_t is_heartbeat, int32_t is_eos)
{
    if (length < 0 || term_offset < 0 || term_offset >= s->term_length)
    {
        s->invalid_packets++;
        return FULMAR_VERDICT_INVALID;
    }
    int64_t position = compute_position(s, term_id, term_offset);
    int32_t verdict = window_verdict(s, position, length, is_heartbeat);
    if (FULMAR_VERDICT_DATA == verdict || FULMAR_VERDICT_HEARTBEAT == verdict)
    {
        record(s, position, length, now_ns, is_heartbeat, is_eos);
    }
    return verdict;
}

void fulmar_image_state_request_status_message(fulmar_image_state_t *s)
{
    s->sm_pending = 1;
}

void fulmar_image_state_end_stream(fulmar_image_state_t *s, int64_t position)
{
    if (s->end_of_stream_position < 0 && position >= 0)
    {
        s->end_of_stream_position = position;
        /* Subscribers' images see the end of the stream through the log. */
        fa_store_i64(s->log + (int64_t)FULMAR_PARTITION_COUNT * s->term_length + END_OF_STREAM_POSITION_OFFSET, position);
    }
}

/* LogBuffers.clean_to: zero from the clean position up to position (rounded
 * down to a frame).  Three terms' worth of positions cover every byte of the
 * three partitions once, so a longer stretch (a subscriber that jumped far
 * ahead) cleans just its last three terms: the same bytes end up zero, in a
 * bounded time. */
static void clean_to(fulmar_image_state_t *s, int64_t position)
{
    position &= ~(int64_t)(FULMAR_FRAME_ALIGNMENT - 1);
    if (position > s->clean_position)
    {
        int64_t from = s->clean_position;
        int64_t whole_log = (int64_t)FULMAR_PARTITION_COUNT * s->term_length;
        if (position - from > whole_log)
        {
            from = position - whole_log;
        }
        fulmar_log_clean(s->log, s->term_length, from, position);
        s->clean_position = position;
    }
}

int32_t fulmar_image_state_is_end_of_stream(const fulmar_image_state_t *s)
{
    return s->end_of_stream_position >= 0 && s->rebuild_position >= s->end_of_stream_position;
}

int32_t fulmar_image_state_rebuild(
    fulmar_image_state_t *s, int64_t now_ns, const int64_t *subscriber_positions, int32_t count)
{
    int32_t work_count = 0;
    if (s->is_rebuilding && count > 0)
    {
        int64_t limit = max_position(s->term_length);
        int64_t min_position = INT64_MAX;
        int64_t max_subscriber = INT64_MIN;
        for (int32_t i = 0; i < count; i++)
        {
            int64_t p = subscriber_positions[i] < limit ? subscriber_positions[i] : limit;
            min_position = p < min_position ? p : min_position;
            max_subscriber = p > max_subscriber ? p : max_subscriber;
        }
        /* A subscriber can be ahead of the rebuild position only if it joined
         * there; everything below it is not ours to rebuild.  One term at
         * most per call, as in Aeron: a scan that reaches the end of a term
         * leaves the position at the next term's start. */
        int64_t position = s->rebuild_position > max_subscriber ? s->rebuild_position : max_subscriber;
        fulmar_nak_t nak;
        int32_t found = fulmar_loss_detector_scan(
            &s->loss_detector, s->log, s->term_length, s->position_bits_to_shift, s->initial_term_id,
            position, s->hwm_position, now_ns, &position, &nak);
        if (found > 0)
        {
            work_count++;
        }
        if (found > 0 && (found & FULMAR_LOSS_NAK_DUE))
        {
            /* Only the latest gap matters: an older one not yet sent has
             * either been filled or is this one. */
            s->pending_nak.term_id = nak.term_id;
            s->pending_nak.term_offset = nak.term_offset;
            s->pending_nak.length = nak.length;
            s->nak_pending = 1;
        }
        if (position > s->rebuild_position)
        {
            s->rebuild_position = position;
            work_count++;
        }

        if (min_position > s->next_sm_position + s->receiver_window_length / 4)
        {
            /* Subscribers have consumed a quarter window: tell the sender,
             * and zero the log a term behind them so that the partition is
             * clean when the stream comes round to it again. */
            clean_to(s, min_position - s->term_length);
            s->next_sm_position = min_position;
            s->sm_pending = 1;
            work_count++;
        }
    }

    if (!s->sending_eos_sm && fulmar_image_state_is_end_of_stream(s))
    {
        /* Everything up to the end of the stream is here: the sender hears
         * so at once, and nothing more will arrive to rebuild. */
        s->sending_eos_sm = 1;
        s->is_rebuilding = 0;
        s->sm_pending = 1;
        work_count++;
    }
    return work_count;
}

int32_t fulmar_image_state_poll_status_message(fulmar_image_state_t *s, int64_t now_ns, fulmar_sm_t *out)
{
    if (!s->sm_pending && now_ns <= s->sm_deadline_ns)
    {
        return 0;
    }
    int64_t position = s->next_sm_position;
    s->sm_pending = 0;
    s->sm_deadline_ns = add_saturating(now_ns, s->status_message_timeout_ns);
    s->last_sm_position = position;
    s->last_overrun_threshold = position + s->term_length / 2;
    s->status_messages_sent++;
    out->session_id = s->session_id;
    out->stream_id = s->stream_id;
    out->consumption_term_id = term_id_at(s->initial_term_id, term_count_of(position, s->position_bits_to_shift));
    out->consumption_term_offset = (int32_t)(position & (s->term_length - 1));
    out->receiver_window = s->receiver_window_length;
    out->flags = s->sending_eos_sm ? FULMAR_SM_EOS_FLAG : 0;
    return 1;
}

int32_t fulmar_image_state_poll_nak(fulmar_image_state_t *s, fulmar_nak_t *out)
{
    if (!s->nak_pending)
    {
        return 0;
    }
    *out = s->pending_nak;
    s->nak_pending = 0;
    s->naks_sent++;
    return 1;
}

int32_t fulmar_image_state_is_timed_out(const fulmar_image_state_t *s, int64_t now_ns)
{
    return now_ns > add_saturating(s->time_of_last_packet_ns, s->image_liveness_timeout_ns);
}

int32_t fulmar_image_state_has_gap(const fulmar_image_state_t *s)
{
    return s->loss_detector.gap_active;
}

int64_t fulmar_image_state_next_deadline_ns(const fulmar_image_state_t *s)
{
    if (s->sm_pending || s->nak_pending)
    {
        return INT64_MIN;
    }
    /* Each deadline is the first time at which its check passes: the SM and
     * liveness checks are strict (now > deadline), the NAK's is not. */
    int64_t deadline = add_saturating(s->sm_deadline_ns, 1);
    int64_t liveness = add_saturating(add_saturating(s->time_of_last_packet_ns, s->image_liveness_timeout_ns), 1);
    deadline = liveness < deadline ? liveness : deadline;
    /* The gap's timer runs only while the image rebuilds. */
    if (s->is_rebuilding && s->loss_detector.gap_active && s->loss_detector.deadline_ns < deadline)
    {
        deadline = s->loss_detector.deadline_ns;
    }
    return deadline;
}
