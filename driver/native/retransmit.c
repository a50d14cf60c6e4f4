#include "_common.h"
#include "_sender.h"
#include "flow_control.h"
#include "retransmit.h"
#include "term.h"

#define MAX_MESSAGE_LENGTH_CAP (16 * 1024 * 1024)

int32_t fulmar_retransmit_init(
    fulmar_retransmit_handler_t *h, int32_t has_group_semantics, int32_t max_retransmits, int64_t delay_ns, int64_t linger_ns)
{
    if (NULL == h)
    {
        return FULMAR_RETRANSMIT_NULL;
    }
    memset(h, 0, sizeof(*h));
    if (max_retransmits < 1 || max_retransmits > FULMAR_RETRANSMIT_MAX_RESEND_MAX)
    {
        return FULMAR_RETRANSMIT_INVALID_MAX_RETRANSMITS;
    }
    if (delay_ns < 0 || linger_ns < 0)
    {
        return FULMAR_RETRANSMIT_INVALID_DELAY;
    }
    h->has_group_semantics = has_group_semantics ? 1 : 0;
    /* Unicast: "a single outstanding retransmit is permitted" (Aeron). */
    h->pool_size = has_group_semantics ? max_retransmits : 1;
    h->delay_ns = delay_ns;
    h->linger_ns = linger_ns;
    return 0;
}

static bool covers(const fulmar_retransmit_action_t *action, int32_t term_id, int32_t term_offset)
{
    return action->term_id == term_id && action->term_offset <= term_offset &&
        (int64_t)term_offset < (int64_t)action->term_offset + action->length;
}

/* The action a NAK may use, or NULL when it is suppressed or there is no
 * room (Aeron's scanForAvailableRetransmit); counts which. */
static fulmar_retransmit_action_t *claim_action(fulmar_retransmit_handler_t *h, int32_t term_id, int32_t term_offset)
{
    if (0 == h->active_count)
    {
        h->active_count++;
        return &h->actions[0];
    }

    fulmar_retransmit_action_t *available = NULL;
    for (int32_t i = 0; i < h->pool_size; i++)
    {
        fulmar_retransmit_action_t *action = &h->actions[i];
        if (FULMAR_RETRANSMIT_INACTIVE == action->state)
        {
            if (NULL == available)
            {
                available = action;
            }
        }
        else if (covers(action, term_id, term_offset))
        {
            h->stats.naks_suppressed++;
            return NULL;
        }
        else if (!h->has_group_semantics)
        {
            /* Unicast, and the NAK is outside the one action: the earlier
             * loss is taken as repaired, this one takes its place. */
            available = action;
        }
    }

    if (!h->has_group_semantics)
    {
        return available;
    }
    if (NULL == available)
    {
        h->stats.retransmit_overflows++;
        return NULL;
    }
    h->active_count++;
    return available;
}

static void resend_action(fulmar_retransmit_handler_t *h, const fulmar_retransmit_action_t *action,
    fulmar_resend_fn resend, void *context)
{
    h->stats.retransmits_sent++;
    if (NULL != resend)
    {
        resend(context, action->term_id, action->term_offset, action->length);
    }
}

static void linger(fulmar_retransmit_handler_t *h, fulmar_retransmit_action_t *action, int64_t now_ns)
{
    action->state = FULMAR_RETRANSMIT_LINGERING;
    action->expiry_ns = fulmar_saturating_add(now_ns, h->linger_ns);
}

void fulmar_retransmit_on_nak(
    fulmar_retransmit_handler_t *h,
    const fulmar_fc_t *fc,
    int32_t term_id,
    int32_t term_offset,
    int32_t length,
    int32_t term_length,
    int64_t now_ns,
    fulmar_resend_fn resend,
    void *context)
{
    h->stats.naks_received++;
    if (term_offset < 0 || (int64_t)term_offset > (int64_t)term_length - FULMAR_HEADER_LENGTH || length <= 0)
    {
        h->stats.invalid_naks++;
        return;
    }

    int32_t retransmit_length;
    if (NULL != fc)
    {
        retransmit_length = fulmar_fc_max_retransmission_length(fc, term_offset, length, term_length);
    }
    else
    {
        int32_t multiple = h->has_group_semantics ?
            FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE : FULMAR_FC_UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE;
        retransmit_length = fulmar_fc_calculate_retransmission_length(length, term_length, term_offset, multiple);
    }

    fulmar_retransmit_action_t *action = claim_action(h, term_id, term_offset);
    if (NULL == action)
    {
        return;
    }
    action->term_id = term_id;
    action->term_offset = term_offset;
    action->length = retransmit_length;

    if (0 == h->delay_ns)
    {
        resend_action(h, action, resend, context);
        linger(h, action, now_ns);
    }
    else
    {
        action->state = FULMAR_RETRANSMIT_DELAYED;
        action->expiry_ns = fulmar_saturating_add(now_ns, h->delay_ns);
    }
}

int32_t fulmar_retransmit_process_timeouts(fulmar_retransmit_handler_t *h, int64_t now_ns, fulmar_resend_fn resend, void *context)
{
    int32_t work_count = 0;
    if (0 == h->active_count)
    {
        return work_count;
    }
    for (int32_t i = 0; i < h->pool_size; i++)
    {
        fulmar_retransmit_action_t *action = &h->actions[i];
        /* Expired strictly after the deadline, as Aeron's "expiryNs - nowNs < 0". */
        if (FULMAR_RETRANSMIT_INACTIVE == action->state || action->expiry_ns >= now_ns)
        {
            continue;
        }
        if (FULMAR_RETRANSMIT_DELAYED == action->state)
        {
            resend_action(h, action, resend, context);
            linger(h, action, now_ns);
        }
        else
        {
            action->state = FULMAR_RETRANSMIT_INACTIVE;
            h->active_count--;
        }
        work_count++;
    }
    return work_count;
}

int64_t fulmar_retransmit_next_deadline_ns(const fulmar_retransmit_handler_t *h)
{
    int64_t deadline = INT64_MAX;
    if (0 == h->active_count)
    {
        return deadline;
    }
    for (int32_t i = 0; i < h->pool_size; i++)
    {
        const fulmar_retransmit_action_t *action = &h->actions[i];
        if (FULMAR_RETRANSMIT_INACTIVE != action->state)
        {
            deadline = fulmar_min_i64(deadline, fulmar_saturating_add(action->expiry_ns, 1));
        }
    }
    return deadline;
}

int64_t fulmar_retransmit_resend_window_length(
    int32_t term_id, int32_t term_offset, int32_t length, int64_t sender_position, int32_t initial_term_id,
    int32_t position_bits_to_shift)
{
    if (position_bits_to_shift < 0 || position_bits_to_shift > FULMAR_SENDER_MAX_POSITION_BITS || length <= 0)
    {
        return 0;
    }
    int64_t term_length = (int64_t)1 << position_bits_to_shift;
    int64_t max_message_length = fulmar_min_i64(term_length / 8, MAX_MESSAGE_LENGTH_CAP);
    int64_t resend_position = fulmar_compute_position(term_id, term_offset, position_bits_to_shift, initial_term_id);
    /* Below sender_position - distance (the bottom of the resend window):
     * older data's slot in the log may already hold a later term, or be
     * being cleaned for one: resending it would send whatever is there now. */
    int64_t bottom_resend_window_distance = (term_length >> 1) + max_message_length;
    if (fulmar_sum_is_before(resend_position, bottom_resend_window_distance, sender_position) ||
        resend_position >= sender_position)
    {
        return 0;
    }
    return fulmar_min_i64(length, sender_position - resend_position);
}
