/* The data plane's receiving side: receive endpoints (the sockets of a UDP
 * subscription's channel: DATA, PAD and SETUP in) and images (each stream's
 * receive state: the log rebuilt, status messages and NAKs back to the
 * sources).  Behaviour as driver/receive_channel_endpoint.py and
 * publication_image.py. */
#define _GNU_SOURCE
#include "_dataplane.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* ---------------------------------------------------------------- endpoints */

dp_receive_endpoint_t *dp_receive_endpoint_new(int64_t id, int64_t receiver_id, int32_t has_group_tag,
                                               int64_t group_tag, const fulmar_udp_address_t *control,
                                               int32_t is_manual, const fulmar_mac_key_t *mac_key,
                                               const char *name)
{
    dp_receive_endpoint_t *endpoint = calloc(1, sizeof(dp_receive_endpoint_t));
    if (NULL == endpoint)
    {
        return NULL;
    }
    endpoint->id = id;
    endpoint->receiver_id = receiver_id;
    endpoint->has_group_tag = has_group_tag;
    endpoint->group_tag = group_tag;
    endpoint->is_manual = is_manual;
    endpoint->mac_key = mac_key;
    if (NULL != control)
    {
        endpoint->has_control = 1;
        endpoint->control = *control;
    }
    for (int32_t i = 0; i < FULMAR_DP_MAX_TRANSPORTS; i++)
    {
        endpoint->fds[i] = -1;
    }
    snprintf(endpoint->name, sizeof(endpoint->name), "%s", NULL == name ? "?" : name);
    return endpoint;
}

void dp_receive_endpoint_free(dp_receive_endpoint_t *endpoint)
{
    free(endpoint->images);
    free(endpoint);
}

static int32_t subscribes(const dp_receive_endpoint_t *endpoint, int32_t stream_id)
{
    for (int32_t i = 0; i < endpoint->stream_count; i++)
    {
        if (endpoint->stream_ids[i] == stream_id)
        {
            return 1;
        }
    }
    return 0;
}

static dp_image_t *image_of(dp_receive_endpoint_t *endpoint, int32_t session_id, int32_t stream_id)
{
    for (int32_t i = 0; i < endpoint->image_count; i++)
    {
        dp_image_t *image = endpoint->images[i];
        if (image->config.session_id == session_id && image->config.stream_id == stream_id)
        {
            return image;
        }
    }
    return NULL;
}

/* A status message or NAK back through the transport it concerns; a failure
 * is left to the next one (status messages repeat, NAKs retry). */
static void send_via(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint, int32_t transport_index,
                     const char *frame, int32_t length, const fulmar_udp_address_t *to)
{
    if (transport_index < 0 || transport_index >= FULMAR_DP_MAX_TRANSPORTS || endpoint->fds[transport_index] < 0)
    {
        return;
    }
    dp_send_datagram(dp, endpoint->fds[transport_index], endpoint->mac_key, frame, length, to);
}

static int32_t encode_status_message(const dp_receive_endpoint_t *endpoint, char *frame, int32_t session_id,
                                     int32_t stream_id, int32_t term_id, int32_t term_offset, int32_t window,
                                     uint8_t flags)
{
    const int32_t frame_length = endpoint->has_group_tag ? DP_SM_WITH_GROUP_TAG_LENGTH : DP_SM_LENGTH;
    const int16_t type = DP_FRAME_SM;
    memcpy(frame, &frame_length, 4);
    frame[4] = 0;
    frame[5] = (char)flags;
    memcpy(frame + 6, &type, 2);
    memcpy(frame + 8, &session_id, 4);
    memcpy(frame + 12, &stream_id, 4);
    memcpy(frame + 16, &term_id, 4);
    memcpy(frame + 20, &term_offset, 4);
    memcpy(frame + 24, &window, 4);
    memcpy(frame + 28, &endpoint->receiver_id, 8);
    if (endpoint->has_group_tag)
    {
        memcpy(frame + DP_SM_LENGTH, &endpoint->group_tag, 8);
    }
    return frame_length;
}

/* Asks a sender we have no image for (or a control address) for a SETUP. */
static void send_setup_request(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint, int32_t session_id,
                               int32_t stream_id, int32_t term_id, int32_t term_offset,
                               const fulmar_udp_address_t *to, int32_t transport_index)
{
    char frame[DP_SM_WITH_GROUP_TAG_LENGTH];
    const int32_t length = encode_status_message(endpoint, frame, session_id, stream_id, term_id, term_offset, 0,
                                                 DP_SM_SEND_SETUP_FLAG);
    send_via(dp, endpoint, transport_index, frame, length, to);
}

static void on_data(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint, const char *datagram, int32_t length,
                    const fulmar_udp_address_t *source, int32_t transport_index);

static void on_setup(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint, const char *datagram, int32_t length,
                     const fulmar_udp_address_t *source, int32_t transport_index)
{
    const int32_t frame_length = fa_read_i32(datagram);
    if (length < DP_SETUP_LENGTH || frame_length < DP_SETUP_LENGTH || frame_length > length)
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    fulmar_dp_event_t event;
    memset(&event, 0, sizeof(event));
    event.term_offset = fa_read_i32(datagram + 8);
    event.session_id = fa_read_i32(datagram + 12);
    event.stream_id = fa_read_i32(datagram + 16);
    event.initial_term_id = fa_read_i32(datagram + 20);
    event.active_term_id = fa_read_i32(datagram + 24);
    event.term_length = fa_read_i32(datagram + 28);
    event.mtu = fa_read_i32(datagram + 32);
    event.ttl = fa_read_i32(datagram + 36);
    if (event.term_offset < 0 || event.term_length < 0 || event.mtu < 0 || !subscribes(endpoint, event.stream_id))
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    dp_image_t *image = image_of(endpoint, event.session_id, event.stream_id);
    if (NULL != image)
    {
        /* This sender has not heard us yet (or a new destination feeds it). */
        image->sources[transport_index] = *source;
        image->has_source[transport_index] = 1;
        fulmar_image_state_request_status_message(&image->state);
        return;
    }
    /* A new sender: the conductor decides whether it gets an image (a log
     * buffer, counters, its subscribers told). */
    event.type = FULMAR_DP_EVENT_SETUP;
    event.transport_index = transport_index;
    event.endpoint_id = endpoint->id;
    event.source = *source;
    dp_push_event(dp, &event);
}

static void dispatch(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint, const char *datagram, int32_t length,
                     const fulmar_udp_address_t *source, int32_t transport_index)
{
    if (length < 8 || 0 != (uint8_t)datagram[4] || (AF_INET != source->family && AF_INET6 != source->family))
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    const int16_t type = fa_read_i16(datagram + 6);
    if (DP_FRAME_DATA == type || DP_FRAME_PAD == type)
    {
        on_data(dp, endpoint, datagram, length, source, transport_index);
    }
    else if (DP_FRAME_SETUP == type)
    {
        on_setup(dp, endpoint, datagram, length, source, transport_index);
    }
    else
    {
        /* An RTTM (this receiver never asks for one) or a frame no receive
         * channel takes: counted, not dropped unseen. */
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
    }
}

int32_t dp_receive_endpoint_poll(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint)
{
    if (endpoint->has_control && 0 == endpoint->image_count)
    {
        /* A subscriber of a dynamic multi-destination-cast publication
         * announces itself to its control address until data flows. */
        if (dp->now_ns >= endpoint->next_announce_ns)
        {
            endpoint->next_announce_ns = dp->now_ns + DP_ANNOUNCE_INTERVAL_NS;
            send_setup_request(dp, endpoint, 0, 0, 0, 0, &endpoint->control, 0);
        }
        dp_deadline(dp, endpoint->next_announce_ns);
    }
    int32_t count = 0;
    for (int32_t transport_index = 0; transport_index < FULMAR_DP_MAX_TRANSPORTS; transport_index++)
    {
        const int32_t fd = endpoint->fds[transport_index];
        if (fd < 0 || !dp_take_readable(dp, fd))
        {
            continue;
        }
        const int32_t received = fulmar_udp_receive_batch(fd, dp->receive_buffer, DP_RECEIVE_SLOT_LENGTH,
                                                          DP_RECEIVE_BATCH, dp->receive_datagrams);
        if (received <= 0)
        {
            continue;
        }
        count += received;
        for (int32_t i = 0; i < received; i++)
        {
            const fulmar_udp_datagram_t *datagram = &dp->receive_datagrams[i];
            const char *bytes = dp->receive_buffer + datagram->offset;
            int32_t length = datagram->length;
            dp_counter_add(dp, DP_BYTES_RECEIVED, length);
            /* Authenticated first: nothing of a datagram without a valid MAC
             * is read (not even its frame type by the loss injector). */
            if (NULL != endpoint->mac_key &&
                !dp_authenticate(dp, endpoint->mac_key, bytes, &length, datagram->truncated, "receive",
                                 endpoint->name, &endpoint->next_refusal_report_ns))
            {
                continue;
            }
            if (dp_drop_incoming(dp, bytes, length))
            {
                continue;
            }
            dispatch(dp, endpoint, bytes, length, &datagram->source, transport_index);
        }
    }
    return count;
}

/* ---------------------------------------------------------------- images */

int32_t dp_image_init(fulmar_dp_t *dp, dp_image_t *image, const fulmar_dp_image_t *config, dp_receive_endpoint_t *endpoint)
{
    if (NULL == config->log || config->transport_index < 0 || config->transport_index >= FULMAR_DP_MAX_TRANSPORTS)
    {
        return FULMAR_DP_INVALID;
    }
    const int32_t result = dp_grow((void ***)&endpoint->images, &endpoint->image_capacity, endpoint->image_count);
    if (result < 0)
    {
        return result;
    }
    if (fulmar_image_state_init(&image->state, config->log, config->term_length, config->initial_term_id,
                                config->session_id, config->stream_id, config->active_term_id, config->term_offset,
                                fulmar_dp_now_ns(), config->initial_window_length, config->status_message_timeout_ns,
                                config->image_liveness_timeout_ns) < 0)
    {
        return FULMAR_DP_INVALID;
    }
    image->config = *config;
    image->endpoint = endpoint;
    image->metadata = config->log + (int64_t)FULMAR_PARTITION_COUNT * config->term_length;
    image->sources[config->transport_index] = config->source;
    image->has_source[config->transport_index] = 1;
    for (int32_t i = 0; i < FULMAR_DP_MAX_TRANSPORTS; i++)
    {
        image->eos_positions[i] = -1;
    }
    image->published_hwm = -1;
    image->published_position = -1;
    endpoint->images[endpoint->image_count++] = image;
    (void)dp;
    return 0;
}

void dp_image_close(dp_image_t *image)
{
    dp_receive_endpoint_t *endpoint = image->endpoint;
    for (int32_t i = 0; i < endpoint->image_count; i++)
    {
        if (endpoint->images[i] == image)
        {
            endpoint->images[i] = endpoint->images[--endpoint->image_count];
            break;
        }
    }
    dp_readers_free(&image->readers);
}

void dp_image_transport_removed(dp_image_t *image, int32_t transport_index)
{
    image->has_source[transport_index] = 0;
    image->eos_positions[transport_index] = -1;
}

/* As Aeron's PublicationImage with its image connections: on a
 * multi-destination endpoint the end of one source's stream (a catch-up
 * replay closed once the live log has caught up) does not end the image
 * while another destination may still bring the stream; it ends when every
 * bound destination's source has sent its end, at the furthest. */
static int32_t insert_packet(dp_image_t *image, int32_t transport_index, int32_t term_id, int32_t term_offset,
                             const char *datagram, int32_t length, int64_t now_ns)
{
    fulmar_image_state_t *state = &image->state;
    const dp_receive_endpoint_t *endpoint = image->endpoint;
    const int32_t verdict = fulmar_image_state_insert_packet(state, term_id, term_offset, datagram, length, now_ns,
                                                             !endpoint->is_manual);
    /* Readers are woken for data, and for the end of the stream (a reader of
     * a closed stream stops on it); a plain heartbeat wakes nobody. */
    if (FULMAR_VERDICT_DATA == verdict ||
        (FULMAR_VERDICT_HEARTBEAT == verdict && fulmar_image_state_is_end_of_stream(state)))
    {
        image->data_arrived = 1;
    }
    if (endpoint->is_manual && state->packet_eos_position >= 0 &&
        (FULMAR_VERDICT_DATA == verdict || FULMAR_VERDICT_HEARTBEAT == verdict))
    {
        image->eos_positions[transport_index] = state->packet_eos_position;
        int64_t furthest = -1;
        int32_t all_ended = 1;
        for (int32_t i = 0; i < FULMAR_DP_MAX_TRANSPORTS; i++)
        {
            if (endpoint->fds[i] < 0)
            {
                continue;
            }
            if (image->eos_positions[i] < 0)
            {
                all_ended = 0;
                break;
            }
            furthest = image->eos_positions[i] > furthest ? image->eos_positions[i] : furthest;
        }
        if (all_ended && furthest >= 0)
        {
            fulmar_image_state_end_stream(state, furthest);
        }
    }
    return verdict;
}

static void on_data(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint, const char *datagram, int32_t length,
                    const fulmar_udp_address_t *source, int32_t transport_index)
{
    if (length < DP_HEADER_LENGTH)
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    const int32_t term_offset = fa_read_i32(datagram + 8);
    const int32_t session_id = fa_read_i32(datagram + 12);
    const int32_t stream_id = fa_read_i32(datagram + 16);
    const int32_t term_id = fa_read_i32(datagram + 20);
    dp_image_t *image = image_of(endpoint, session_id, stream_id);
    if (NULL == image)
    {
        if (!subscribes(endpoint, stream_id))
        {
            /* Misdirected or hostile: no subscriber can ever take it. */
            dp_counter_add(dp, DP_INVALID_PACKETS, 1);
            return;
        }
        /* Data from a sender we have no image for: ask it for a SETUP. */
        send_setup_request(dp, endpoint, session_id, stream_id, term_id, term_offset, source, transport_index);
        return;
    }
    if (!image->has_source[transport_index])
    {
        image->sources[transport_index] = *source;   /* one more source feeding this image */
        image->has_source[transport_index] = 1;
    }
    if (DP_HEADER_LENGTH == length && 0 == fa_read_i32(datagram))
    {
        dp_counter_add(dp, DP_HEARTBEATS_RECEIVED, 1);
    }
    switch (insert_packet(image, transport_index, term_id, term_offset, datagram, length, dp->now_ns))
    {
        case FULMAR_VERDICT_INVALID: dp_counter_add(dp, DP_INVALID_PACKETS, 1); break;
        /* Outside the receiver window: dropped, and counted as Aeron does (a
         * sender that honours our status messages never gets there). */
        case FULMAR_VERDICT_OVER_RUN: dp_counter_add(dp, DP_FLOW_CONTROL_OVER_RUNS, 1); break;
        case FULMAR_VERDICT_UNDER_RUN: dp_counter_add(dp, DP_FLOW_CONTROL_UNDER_RUNS, 1); break;
        default: break;
    }
}

/* The receiver's duty cycle for one image: rebuild, NAK, status messages. */
int32_t dp_image_do_work(fulmar_dp_t *dp, dp_image_t *image)
{
    fulmar_image_state_t *state = &image->state;
    const int64_t now_ns = dp->now_ns;
    int64_t *positions = image->readers.positions;
    const int32_t count = image->readers.position_count;
    int64_t slowest = INT64_MAX;
    for (int32_t i = 0; i < count; i++)
    {
        positions[i] = dp_counter_get(dp, image->readers.position_ids[i]);
        slowest = positions[i] < slowest ? positions[i] : slowest;
    }
    int32_t work = fulmar_image_state_rebuild(state, now_ns, positions, count);
    /* Subscribers still reading will want a status message on time, and
     * their progress rings nobody: look again soon. */
    image->needs_prompt_cycles = count > 0 && slowest < state->rebuild_position;

    dp_receive_endpoint_t *endpoint = image->endpoint;
    fulmar_sm_t message;
    if (fulmar_image_state_poll_status_message(state, now_ns, &message))
    {
        char frame[DP_SM_WITH_GROUP_TAG_LENGTH];
        const int32_t length = encode_status_message(
            endpoint, frame, message.session_id, message.stream_id, message.consumption_term_id,
            message.consumption_term_offset, message.receiver_window, (uint8_t)message.flags);
        for (int32_t i = 0; i < FULMAR_DP_MAX_TRANSPORTS; i++)
        {
            if (image->has_source[i])
            {
                send_via(dp, endpoint, i, frame, length, &image->sources[i]);
            }
        }
        dp_counter_add(dp, DP_STATUS_MESSAGES_SENT, 1);
        work++;
    }
    fulmar_nak_t nak;
    if (fulmar_image_state_poll_nak(state, &nak))
    {
        char frame[DP_NAK_LENGTH];
        const int32_t frame_length = DP_NAK_LENGTH;
        const int16_t type = DP_FRAME_NAK;
        memcpy(frame, &frame_length, 4);
        frame[4] = 0;
        frame[5] = 0;
        memcpy(frame + 6, &type, 2);
        memcpy(frame + 8, &nak.session_id, 4);
        memcpy(frame + 12, &nak.stream_id, 4);
        memcpy(frame + 16, &nak.term_id, 4);
        memcpy(frame + 20, &nak.term_offset, 4);
        memcpy(frame + 24, &nak.length, 4);
        for (int32_t i = 0; i < FULMAR_DP_MAX_TRANSPORTS; i++)
        {
            if (image->has_source[i])
            {
                send_via(dp, endpoint, i, frame, DP_NAK_LENGTH, &image->sources[i]);
            }
        }
        dp_counter_add(dp, DP_NAK_MESSAGES_SENT, 1);
        work++;
    }
    if (state->hwm_position != image->published_hwm)
    {
        image->published_hwm = state->hwm_position;
        dp_counter_set(dp, image->config.receiver_hwm_id, image->published_hwm);
    }
    if (state->rebuild_position != image->published_position)
    {
        image->published_position = state->rebuild_position;
        dp_counter_set(dp, image->config.receiver_position_id, image->published_position);
    }
    dp_deadline(dp, fulmar_image_state_next_deadline_ns(state));
    if (image->needs_prompt_cycles)
    {
        dp_deadline(dp, now_ns + dp->config.prompt_interval_ns);
    }
    return work;
}
