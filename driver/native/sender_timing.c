#include <stdlib.h>

#include "_common.h"
#include "_sender.h"
#include "sender_timing.h"

static fulmar_sender_liveness_t *find_live(fulmar_sender_timing_t *t, int64_t receiver_id)
{
    for (int32_t i = 0; i < t->receiver_count; i++)
    {
        if (t->receivers[i].receiver_id == receiver_id)
        {
            return &t->receivers[i];
        }
    }
    return NULL;
}

/* Records a status message from a receiver; false when it is new and memory
 * ran out (it is then not live). */
static bool track(fulmar_sender_timing_t *t, int64_t receiver_id, int64_t now_ns)
{
    fulmar_sender_liveness_t *receiver = find_live(t, receiver_id);
    if (NULL == receiver)
    {
        if (t->receiver_count == t->receiver_capacity)
        {
            if (t->receiver_capacity > INT32_MAX / 2)
            {
                return false;
            }
            int32_t capacity = t->receiver_capacity ? 2 * t->receiver_capacity : 4;
            fulmar_sender_liveness_t *grown = realloc(t->receivers, (size_t)capacity * sizeof(*grown));
            if (NULL == grown)
            {
                return false;
            }
            t->receivers = grown;
            t->receiver_capacity = capacity;
        }
        receiver = &t->receivers[t->receiver_count++];
        receiver->receiver_id = receiver_id;
    }
    receiver->last_status_message_ns = now_ns;
    return true;
}

/* Order does not matter to liveness: the last entry fills the hole. */
static void forget_at(fulmar_sender_timing_t *t, int32_t index)
{
    t->receivers[index] = t->receivers[--t->receiver_count];
}

static bool forget(fulmar_sender_timing_t *t, int64_t receiver_id)
{
    fulmar_sender_liveness_t *receiver = find_live(t, receiver_id);
    if (NULL == receiver)
    {
        return false;
    }
    forget_at(t, (int32_t)(receiver - t->receivers));
    return true;
}

int32_t fulmar_sender_timing_init(
    fulmar_sender_timing_t *t,
    int64_t now_ns,
    int64_t connection_timeout_ns,
    int64_t setup_timeout_ns,
    int64_t heartbeat_timeout_ns,
    int64_t initial_setup_interval_ns)
{
    if (NULL == t)
    {
        return FULMAR_SENDER_TIMING_NULL;
    }
    memset(t, 0, sizeof(*t));
    if (connection_timeout_ns < 0 || setup_timeout_ns < 0 || heartbeat_timeout_ns < 0 || initial_setup_interval_ns < 0)
    {
        return FULMAR_SENDER_TIMING_INVALID_TIMEOUT;
    }
    t->connection_timeout_ns = connection_timeout_ns;
    t->setup_timeout_ns = setup_timeout_ns;
    t->heartbeat_timeout_ns = heartbeat_timeout_ns;
    t->setup_interval_ns = (0 == initial_setup_interval_ns || initial_setup_interval_ns > setup_timeout_ns) ?
        setup_timeout_ns : initial_setup_interval_ns;
    /* Both are due at once on the first check.  (Only a now_ns within a
     * timeout of INT64_MIN saturates here; a monotonic clock never is.) */
    t->time_of_last_setup_ns = fulmar_saturating_add(now_ns, -setup_timeout_ns - 1);
    t->time_of_last_data_or_heartbeat_ns = fulmar_saturating_add(now_ns, -heartbeat_timeout_ns - 1);
    return 0;
}

void fulmar_sender_timing_close(fulmar_sender_timing_t *t)
{
    if (NULL == t)
    {
        return;
    }
    free(t->receivers);
    memset(t, 0, sizeof(*t));
}

int32_t fulmar_sender_timing_on_status_message(fulmar_sender_timing_t *t, int64_t receiver_id, int32_t is_eos, int64_t now_ns)
{
    if (is_eos)
    {
        forget(t, receiver_id);
    }
    else
    {
        track(t, receiver_id, now_ns);
    }
    int32_t had_receivers = t->has_receivers;
    t->has_receivers = t->receiver_count > 0 ? 1 : 0;
    t->has_initial_connection = 1;
    t->time_of_last_status_message_ns = now_ns;
    t->has_status_message_time = 1;
    return t->has_receivers && !had_receivers ? 1 : 0;
}

void fulmar_sender_timing_on_trigger_send_setup(fulmar_sender_timing_t *t, int64_t now_ns, int32_t is_end_of_stream)
{
    if (!is_end_of_stream)
    {
        t->time_of_last_status_message_ns = now_ns;
        t->has_status_message_time = 1;
        t->is_setup_elicited = 1;
    }
}

int32_t fulmar_sender_timing_on_error(fulmar_sender_timing_t *t, int64_t receiver_id)
{
    bool was_live = forget(t, receiver_id);
    t->has_receivers = t->receiver_count > 0 ? 1 : 0;
    return was_live ? 1 : 0;
}

/* The interval a SETUP waits after the last, or -1 when none is wanted:
 * after a first status message SETUP goes only when elicited. */
static int64_t setup_interval(const fulmar_sender_timing_t *t)
{
    if (t->has_initial_connection && !t->is_setup_elicited)
    {
        return -1;
    }
    /* The fast pace holds whatever asked (a destination added to a manual
     * MDC publication elicits SETUP too) until a first status message. */
    return t->has_initial_connection ? t->setup_timeout_ns : t->setup_interval_ns;
}

int32_t fulmar_sender_timing_setup_due(fulmar_sender_timing_t *t, int64_t now_ns)
{
    int64_t interval = setup_interval(t);
    /* Due strictly after the interval, as Aeron's "last + timeout - now < 0". */
    if (interval < 0 || !fulmar_sum_is_before(t->time_of_last_setup_ns, interval, now_ns))
    {
        return FULMAR_SETUP_NO;
    }
    bool backing_off = !t->has_initial_connection;
    t->time_of_last_setup_ns = now_ns;
    int32_t due = t->is_setup_elicited ? FULMAR_SETUP_ELICITED : FULMAR_SETUP_INITIAL;
    if (backing_off)
    {
        /* The first SETUP goes at once, not after an interval, so doubling
         * starts at the second: gaps of 1, 2, 4... intervals, up to the
         * setup timeout. */
        if (t->initial_setups_sent)
        {
            int64_t doubled = fulmar_saturating_add(t->setup_interval_ns, t->setup_interval_ns);
            t->setup_interval_ns = fulmar_min_i64(doubled, t->setup_timeout_ns);
        }
        t->initial_setups_sent++;
    }
    /* An elicited SETUP repeats until receivers are live again. */
    if (t->is_setup_elicited && t->has_receivers)
    {
        t->is_setup_elicited = 0;
    }
    return due;
}

int32_t fulmar_sender_timing_setup_backing_off(const fulmar_sender_timing_t *t)
{
    return !t->has_initial_connection && t->setup_interval_ns < t->setup_timeout_ns ? 1 : 0;
}

int32_t fulmar_sender_timing_heartbeat_due(fulmar_sender_timing_t *t, int64_t now_ns)
{
    /* Receivers learn the stream's tail from SETUP until they first answer. */
    if (!t->has_initial_connection)
    {
        return 0;
    }
    if (!fulmar_sum_is_before(t->time_of_last_data_or_heartbeat_ns, t->heartbeat_timeout_ns, now_ns))
    {
        return 0;
    }
    t->time_of_last_data_or_heartbeat_ns = now_ns;
    return 1;
}

void fulmar_sender_timing_on_data_sent(fulmar_sender_timing_t *t, int64_t now_ns)
{
    t->time_of_last_data_or_heartbeat_ns = now_ns;
}

void fulmar_sender_timing_on_idle(fulmar_sender_timing_t *t, int64_t now_ns)
{
    /* Gone once silent for the whole timeout: last <= now - timeout. */
    for (int32_t i = 0; i < t->receiver_count;)
    {
        if (fulmar_sum_is_at_or_before(t->receivers[i].last_status_message_ns, t->connection_timeout_ns, now_ns))
        {
            forget_at(t, i);
        }
        else
        {
            i++;
        }
    }
    t->has_receivers = t->receiver_count > 0 ? 1 : 0;
}

int32_t fulmar_sender_timing_is_connected(const fulmar_sender_timing_t *t, int32_t has_required_receivers)
{
    return t->has_receivers && has_required_receivers ? 1 : 0;
}

int64_t fulmar_sender_timing_next_deadline_ns(const fulmar_sender_timing_t *t)
{
    int64_t deadline = INT64_MAX;
    /* SETUP and heartbeat fall due one nanosecond after their interval ends. */
    int64_t interval = setup_interval(t);
    if (interval >= 0)
    {
        int64_t due = fulmar_saturating_add(fulmar_saturating_add(t->time_of_last_setup_ns, interval), 1);
        deadline = fulmar_min_i64(deadline, due);
    }
    if (t->has_initial_connection)
    {
        int64_t due = fulmar_saturating_add(
            fulmar_saturating_add(t->time_of_last_data_or_heartbeat_ns, t->heartbeat_timeout_ns), 1);
        deadline = fulmar_min_i64(deadline, due);
    }
    /* A receiver is forgotten at exactly its timeout. */
    for (int32_t i = 0; i < t->receiver_count; i++)
    {
        int64_t silent = fulmar_saturating_add(t->receivers[i].last_status_message_ns, t->connection_timeout_ns);
        deadline = fulmar_min_i64(deadline, silent);
    }
    return deadline;
}
