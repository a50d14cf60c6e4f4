#include <stdlib.h>

#include "_common.h"
#include "_sender.h"
#include "flow_control.h"

/* Every receiver of a tag-less strategy is a member; tagged wants its tag. */
static bool matches_tag(const fulmar_fc_t *fc, int32_t has_group_tag, int64_t group_tag)
{
    if (FULMAR_FC_TAGGED == fc->strategy)
    {
        return has_group_tag && group_tag == fc->group_tag;
    }
    return true;
}

static bool is_min_family(const fulmar_fc_t *fc)
{
    return FULMAR_FC_MIN == fc->strategy || FULMAR_FC_TAGGED == fc->strategy;
}

/* Silent for longer than the receiver timeout: Aeron's
 * "timeOfLastStatusMessage + timeout - now < 0", strictly after. */
static bool has_timed_out(const fulmar_fc_t *fc, int64_t time_ns, int64_t now_ns)
{
    return fulmar_sum_is_before(time_ns, fc->receiver_timeout_ns, now_ns);
}

static fulmar_fc_receiver_t *find_receiver(fulmar_fc_t *fc, int64_t receiver_id)
{
    for (int32_t i = 0; i < fc->receiver_count; i++)
    {
        if (fc->receivers[i].receiver_id == receiver_id)
        {
            return &fc->receivers[i];
        }
    }
    return NULL;
}

/* Appends a receiver, growing the array; NULL when memory ran out (the
 * caller then carries on as if the strategy had declined the receiver). */
static fulmar_fc_receiver_t *add_receiver(
    fulmar_fc_t *fc, int64_t receiver_id, int64_t position, int64_t position_plus_window, int64_t now_ns)
{
    if (fc->receiver_count == fc->receiver_capacity)
    {
        if (fc->receiver_capacity > INT32_MAX / 2)
        {
            return NULL;
        }
        int32_t capacity = fc->receiver_capacity ? 2 * fc->receiver_capacity : 4;
        fulmar_fc_receiver_t *grown = realloc(fc->receivers, (size_t)capacity * sizeof(*grown));
        if (NULL == grown)
        {
            return NULL;
        }
        fc->receivers = grown;
        fc->receiver_capacity = capacity;
    }
    fulmar_fc_receiver_t *receiver = &fc->receivers[fc->receiver_count++];
    receiver->receiver_id = receiver_id;
    receiver->position = position;
    receiver->position_plus_window = position_plus_window;
    receiver->time_of_last_status_message_ns = now_ns;
    receiver->eos_flagged = 0;
    return receiver;
}

/* Removes one receiver, keeping the others in the order they joined. */
static void remove_receiver(fulmar_fc_t *fc, fulmar_fc_receiver_t *receiver)
{
    int32_t index = (int32_t)(receiver - fc->receivers);
    memmove(receiver, receiver + 1, (size_t)(fc->receiver_count - index - 1) * sizeof(*receiver));
    fc->receiver_count--;
}

int32_t fulmar_fc_init(
    fulmar_fc_t *fc, int32_t strategy, int64_t receiver_timeout_ns, int32_t group_min_size, int64_t group_tag)
{
    if (NULL == fc)
    {
        return FULMAR_FC_NULL;
    }
    memset(fc, 0, sizeof(*fc));
    int32_t multiple;
    switch (strategy)
    {
        case FULMAR_FC_UNICAST:
            multiple = FULMAR_FC_UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE;
            break;
        case FULMAR_FC_MAX:
            multiple = FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE;
            break;
        case FULMAR_FC_MIN:
        case FULMAR_FC_TAGGED:
            multiple = FULMAR_FC_MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE;
            break;
        default:
            return FULMAR_FC_INVALID_STRATEGY;
    }
    if (receiver_timeout_ns < 0)
    {
        return FULMAR_FC_INVALID_TIMEOUT;
    }
    /* Unicast and max take no group size, so only the strategies that use it
     * refuse a negative one. */
    bool is_min = FULMAR_FC_MIN == strategy || FULMAR_FC_TAGGED == strategy;
    if (is_min && group_min_size < 0)
    {
        return FULMAR_FC_INVALID_GROUP_MIN_SIZE;
    }
    fc->strategy = strategy;
    fc->receiver_timeout_ns = receiver_timeout_ns;
    fc->group_min_size = is_min ? group_min_size : 0;
    fc->group_tag = FULMAR_FC_TAGGED == strategy ? group_tag : FULMAR_FC_GROUP_TAG_DEFAULT;
    fc->retransmit_receiver_window_multiple = multiple;
    return 0;
}

void fulmar_fc_close(fulmar_fc_t *fc)
{
    if (NULL == fc)
    {
        return;
    }
    free(fc->receivers);
    memset(fc, 0, sizeof(*fc));
}

/* The limit at the last elicited SETUP while it still applies, else none. */
static int64_t setup_limit(fulmar_fc_t *fc, int64_t now_ns)
{
    if (fc->has_last_setup_sender_limit)
    {
        if (has_timed_out(fc, fc->time_of_last_setup_ns, now_ns))
        {
            fc->has_last_setup_sender_limit = 0;
        }
        else
        {
            return fc->last_setup_sender_limit;
        }
    }
    return INT64_MAX;
}

/* Unicast and max: receivers are remembered for observability only. */
static void max_observe(fulmar_fc_t *fc, int64_t receiver_id, int64_t position, int64_t position_plus_window,
    int64_t now_ns, int32_t is_eos)
{
    fulmar_fc_receiver_t *receiver = find_receiver(fc, receiver_id);
    if (is_eos)
    {
        if (NULL != receiver)
        {
            remove_receiver(fc, receiver);
        }
        return;
    }
    if (NULL == receiver)
    {
        add_receiver(fc, receiver_id, position, position_plus_window, now_ns);
        return;
    }
    receiver->position = fulmar_max_i64(receiver->position, position);
    receiver->position_plus_window = position_plus_window;
    receiver->time_of_last_status_message_ns = now_ns;
}

static int64_t min_on_status_message(fulmar_fc_t *fc, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag,
    int64_t position, int32_t receiver_window, int64_t sender_limit, int64_t now_ns, int32_t is_eos)
{
    int64_t position_plus_window = position + receiver_window;
    bool is_member = matches_tag(fc, has_group_tag, group_tag);
    int64_t min_position = setup_limit(fc, now_ns);

    fulmar_fc_receiver_t *receiver = is_member ? find_receiver(fc, receiver_id) : NULL;
    if (NULL != receiver)
    {
        /* The right edge may move back: a receiver may shrink its window. */
        receiver->eos_flagged = is_eos ? 1 : 0;
        receiver->position = fulmar_max_i64(receiver->position, position);
        receiver->position_plus_window = position_plus_window;
        receiver->time_of_last_status_message_ns = now_ns;
    }
    for (int32_t i = 0; i < fc->receiver_count; i++)
    {
        min_position = fulmar_min_i64(min_position, fc->receivers[i].position_plus_window);
    }

    /* A newcomer joins unless it is leaving, or so far behind (its right edge
     * more than its own window below the minimum) that it would stall
     * everyone: it must catch up first.  Written as a sum of the message's
     * own bounded values, since the minimum may be a SETUP cap anywhere in
     * the int64 range. */
    if (NULL == receiver && is_member && !is_eos &&
        (0 == fc->receiver_count || position_plus_window + receiver_window >= min_position))
    {
        if (NULL != add_receiver(fc, receiver_id, position, position_plus_window, now_ns))
        {
            min_position = fulmar_min_i64(min_position, position_plus_window);
            fc->has_last_setup_sender_limit = 0;
        }
    }

    if (fc->receiver_count < fc->group_min_size)
    {
        return sender_limit;
    }
    if (0 == fc->receiver_count)
    {
        /* No member at all (and no minimum size): the message's own edge, so
         * a stream with only untagged receivers is not stuck. */
        return fulmar_max_i64(sender_limit, position_plus_window);
    }
    return fulmar_max_i64(sender_limit, min_position);
}

int64_t fulmar_fc_on_status_message(
    fulmar_fc_t *fc,
    int32_t consumption_term_id,
    int32_t consumption_term_offset,
    int32_t receiver_window,
    int64_t receiver_id,
    int32_t has_group_tag,
    int64_t group_tag,
    int64_t sender_limit,
    int32_t initial_term_id,
    int32_t position_bits_to_shift,
    int64_t now_ns,
    int32_t is_eos)
{
    if (position_bits_to_shift < 0 || position_bits_to_shift > FULMAR_SENDER_MAX_POSITION_BITS)
    {
        return sender_limit;
    }
    int64_t position = fulmar_compute_position(
        consumption_term_id, consumption_term_offset, position_bits_to_shift, initial_term_id);
    if (is_min_family(fc))
    {
        return min_on_status_message(
            fc, receiver_id, has_group_tag, group_tag, position, receiver_window, sender_limit, now_ns, is_eos);
    }
    /* Unicast and max: the furthest right edge ever reported; a late,
     * reordered status message cannot shrink it. */
    int64_t position_plus_window = position + receiver_window;
    max_observe(fc, receiver_id, position, position_plus_window, now_ns, is_eos);
    return fulmar_max_i64(sender_limit, position_plus_window);
}

int64_t fulmar_fc_on_idle(fulmar_fc_t *fc, int64_t now_ns, int64_t sender_limit, int64_t sender_position, int32_t is_eos)
{
    bool is_min = is_min_family(fc);
    int64_t min_limit_position = is_min ? setup_limit(fc, now_ns) : INT64_MAX;

    /* Drop in one pass, keeping the survivors in the order they joined. */
    int32_t kept = 0;
    for (int32_t i = 0; i < fc->receiver_count; i++)
    {
        fulmar_fc_receiver_t *receiver = &fc->receivers[i];
        bool drop = has_timed_out(fc, receiver->time_of_last_status_message_ns, now_ns) ||
            (is_min && receiver->eos_flagged);
        if (drop)
        {
            continue;
        }
        min_limit_position = fulmar_min_i64(min_limit_position, receiver->position_plus_window);
        if (kept != i)
        {
            fc->receivers[kept] = *receiver;
        }
        kept++;
    }
    fc->receiver_count = kept;

    /* Max never moves the limit here; min falls back to the slowest receiver
     * (the only place the limit moves back), unless the group is short. */
    if (!is_min || 0 == fc->receiver_count || fc->receiver_count < fc->group_min_size)
    {
        return sender_limit;
    }
    return min_limit_position;
}

void fulmar_fc_on_trigger_send_setup(
    fulmar_fc_t *fc, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag, int64_t now_ns)
{
    if (is_min_family(fc) && !fc->has_tagged_status_message_triggered_setup)
    {
        fc->has_tagged_status_message_triggered_setup = matches_tag(fc, has_group_tag, group_tag) ? 1 : 0;
    }
}

int64_t fulmar_fc_on_setup(
    fulmar_fc_t *fc, int64_t sender_limit, int64_t sender_position, int32_t position_bits_to_shift, int64_t now_ns)
{
    if (!is_min_family(fc))
    {
        return sender_limit;
    }
    /* A member is joining: hold the sender where it is until it does, so the
     * tracked receivers cannot pull it beyond what the newcomer can take. */
    if (fc->has_tagged_status_message_triggered_setup && fc->receiver_count > 0)
    {
        fc->time_of_last_setup_ns = now_ns;
        fc->has_last_setup_sender_limit = 1;
        fc->last_setup_sender_limit = sender_limit;
    }
    fc->has_tagged_status_message_triggered_setup = 0;
    return sender_limit;
}

void fulmar_fc_on_error(fulmar_fc_t *fc, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag, int64_t now_ns)
{
    if (!is_min_family(fc))
    {
        return;
    }
    /* The receiver rejected the stream: it goes at the next idle. */
    fulmar_fc_receiver_t *receiver = find_receiver(fc, receiver_id);
    if (NULL != receiver && matches_tag(fc, has_group_tag, group_tag))
    {
        receiver->eos_flagged = 1;
    }
}

int32_t fulmar_fc_has_required_receivers(const fulmar_fc_t *fc)
{
    if (!is_min_family(fc))
    {
        return 1;
    }
    return fc->receiver_count >= fc->group_min_size ? 1 : 0;
}

int32_t fulmar_fc_receiver_window_length(int32_t term_length, int32_t initial_window_length)
{
    int32_t half_term = term_length >> 1;
    return initial_window_length < half_term ? initial_window_length : half_term;
}

int32_t fulmar_fc_calculate_retransmission_length(
    int32_t resend_length, int32_t term_length, int32_t term_offset, int32_t retransmit_receiver_window_multiple)
{
    if (term_length <= 0 || term_offset < 0 || term_offset > term_length || resend_length <= 0)
    {
        return 0;
    }
    /* In int64: half a large term times the multiple passes INT32_MAX. */
    int64_t estimated_retransmit_length =
        (int64_t)fulmar_fc_receiver_window_length(term_length, FULMAR_FC_INITIAL_WINDOW_LENGTH_DEFAULT) *
        retransmit_receiver_window_multiple;
    int64_t length = fulmar_min_i64(resend_length, (int64_t)term_length - term_offset);
    length = fulmar_min_i64(length, estimated_retransmit_length);
    /* A non-positive multiple (only by writing the field) would make it negative. */
    return length < 0 ? 0 : (int32_t)length;
}

int32_t fulmar_fc_max_retransmission_length(
    const fulmar_fc_t *fc, int32_t term_offset, int32_t resend_length, int32_t term_length)
{
    return fulmar_fc_calculate_retransmission_length(
        resend_length, term_length, term_offset, fc->retransmit_receiver_window_multiple);
}
