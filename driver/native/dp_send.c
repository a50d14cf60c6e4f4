/* The data plane's sending side: send endpoints (a socket, its destinations,
 * the control frames its receivers send back) and network publications (the
 * sender's duty cycle over a log buffer: data within the flow control window,
 * SETUPs until a receiver answers, heartbeats when idle, retransmits on NAKs).
 * Behaviour as driver/network_publication.py and send_channel_endpoint.py. */
#define _GNU_SOURCE
#include "_dataplane.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* ---------------------------------------------------------------- endpoints */

dp_send_endpoint_t *dp_send_endpoint_new(int64_t id, int32_t fd, int32_t control_mode,
                                         const fulmar_udp_address_t *destination,
                                         const fulmar_mac_key_t *mac_key, const char *name)
{
    dp_send_endpoint_t *endpoint = calloc(1, sizeof(dp_send_endpoint_t));
    if (NULL == endpoint)
    {
        return NULL;
    }
    endpoint->id = id;
    endpoint->fd = fd;
    endpoint->control_mode = control_mode;
    endpoint->mac_key = mac_key;
    snprintf(endpoint->name, sizeof(endpoint->name), "%s", NULL == name ? "?" : name);
    if (NULL != destination)
    {
        endpoint->destinations[0].address = *destination;
        endpoint->destinations[0].time_of_last_sm_ns = -1;
        endpoint->destination_count = 1;
    }
    return endpoint;
}

void dp_send_endpoint_free(dp_send_endpoint_t *endpoint)
{
    free(endpoint->publications);
    free(endpoint);
}

static void report_send_error(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint, const fulmar_udp_address_t *to, int error)
{
    char text[64];
    dp_error(dp, "send channel %s: cannot send to %s: [Errno %d] %s",
             endpoint->name, dp_address_text(to, text, sizeof(text)), error, strerror(error));
}

/* A control frame or a SETUP/heartbeat to every destination. */
static void send_to_all(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint, const char *datagram, int32_t length)
{
    for (int32_t i = 0; i < endpoint->destination_count; i++)
    {
        const int error = dp_send_datagram(dp, endpoint->fd, endpoint->mac_key, datagram, length,
                                           &endpoint->destinations[i].address);
        if (0 != error)
        {
            report_send_error(dp, endpoint, &endpoint->destinations[i].address, error);
        }
    }
}

/* Data regions of a log to every destination; a failing destination is
 * reported and the rest still get them (a retransmit repairs the loss). */
static void send_regions(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint, const char *log, int64_t log_length,
                         const int32_t *regions, int32_t count)
{
    const int32_t lossy = dp_counter_get(dp, DP_LOSS_SEND_RATE_PPM) > 0;
    int32_t kept_regions[2 * DP_MAX_DATAGRAMS_PER_SEND];
    /* datagram-mac: each datagram's MAC, computed once for every destination
     * (it covers the frames only, not where they go) and sent after the
     * frames as a second piece of the datagram, the log not copied. */
    uint8_t macs[DP_MAX_DATAGRAMS_PER_SEND][FULMAR_MAC_LENGTH];
    uint8_t kept_macs[DP_MAX_DATAGRAMS_PER_SEND][FULMAR_MAC_LENGTH];
    const fulmar_mac_key_t *mac_key = endpoint->mac_key;
    if (NULL != mac_key && endpoint->destination_count > 0)
    {
        for (int32_t r = 0; r < count; r++)
        {
            fulmar_mac2(mac_key, (const uint8_t *)log + regions[2 * r], regions[2 * r + 1], NULL, 0, macs[r]);
        }
    }
    for (int32_t i = 0; i < endpoint->destination_count; i++)
    {
        const fulmar_udp_address_t *to = &endpoint->destinations[i].address;
        const int32_t *sending = regions;
        const uint8_t *trailers = NULL != mac_key ? &macs[0][0] : NULL;
        int32_t sending_count = count;
        if (lossy)
        {
            /* Loss injection: each destination's copy is lost on its own, as on a network. */
            sending_count = 0;
            for (int32_t r = 0; r < count; r++)
            {
                if (!dp_drop_outgoing(dp, log + regions[2 * r], regions[2 * r + 1]))
                {
                    kept_regions[2 * sending_count] = regions[2 * r];
                    kept_regions[2 * sending_count + 1] = regions[2 * r + 1];
                    if (NULL != mac_key)
                    {
                        memcpy(kept_macs[sending_count], macs[r], FULMAR_MAC_LENGTH);
                    }
                    sending_count++;
                }
            }
            sending = kept_regions;
            trailers = NULL != mac_key ? &kept_macs[0][0] : NULL;
        }
        if (0 == sending_count)
        {
            continue;
        }
        const int32_t sent = fulmar_udp_send_batch(endpoint->fd, log, log_length, sending, sending_count, trailers,
                                                   FULMAR_MAC_LENGTH, to);
        if (sent < 0)
        {
            report_send_error(dp, endpoint, to, -sent);
        }
        else if (sent < sending_count)
        {
            dp_counter_add(dp, DP_SHORT_SENDS, 1);
        }
    }
}

static void on_receiver_heard(dp_send_endpoint_t *endpoint, const fulmar_udp_address_t *source, int64_t now_ns)
{
    if (FULMAR_DP_CONTROL_DYNAMIC != endpoint->control_mode)
    {
        return;
    }
    for (int32_t i = 0; i < endpoint->destination_count; i++)
    {
        if (dp_address_equal(&endpoint->destinations[i].address, source))
        {
            endpoint->destinations[i].time_of_last_sm_ns = now_ns;
            return;
        }
    }
    if (endpoint->destination_count < FULMAR_DP_MAX_DESTINATIONS)
    {
        dp_destination_t *added = &endpoint->destinations[endpoint->destination_count++];
        added->address = *source;
        added->time_of_last_sm_ns = now_ns;
    }
}

static void expire_destinations(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint)
{
    for (int32_t i = 0; i < endpoint->destination_count;)
    {
        const int64_t heard_ns = endpoint->destinations[i].time_of_last_sm_ns;
        if (heard_ns >= 0 && dp->now_ns - heard_ns > DP_DESTINATION_TIMEOUT_NS)
        {
            endpoint->destinations[i] = endpoint->destinations[--endpoint->destination_count];
            continue;
        }
        if (heard_ns >= 0)
        {
            dp_deadline(dp, heard_ns + DP_DESTINATION_TIMEOUT_NS + 1);
        }
        i++;
    }
}

static dp_network_publication_t *publication_of(dp_send_endpoint_t *endpoint, int32_t session_id, int32_t stream_id)
{
    for (int32_t i = 0; i < endpoint->publication_count; i++)
    {
        dp_network_publication_t *publication = endpoint->publications[i];
        if (publication->config.session_id == session_id && publication->config.stream_id == stream_id)
        {
            return publication;
        }
    }
    return NULL;
}

static void on_status_message(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame, int32_t length);
static void on_nak(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame);
static void on_rttm(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame,
                    const fulmar_udp_address_t *source);
static void on_error_frame(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame, int32_t length);

/* A control frame's common checks (frames.py's _check_header): the version,
 * and a frame length at least the frame's size and within the datagram. */
static int valid_control_frame(const char *datagram, int32_t length, int32_t minimum)
{
    if (length < minimum)
    {
        return 0;
    }
    const int32_t frame_length = fa_read_i32(datagram);
    return 0 == (uint8_t)datagram[4] && frame_length >= minimum && frame_length <= length;
}

static void dispatch(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint, const char *datagram, int32_t length,
                     const fulmar_udp_address_t *source)
{
    if (length < 8 || 0 != (uint8_t)datagram[4])
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    const int16_t type = fa_read_i16(datagram + 6);
    int32_t minimum;
    switch (type)
    {
        case DP_FRAME_SM: minimum = DP_SM_LENGTH; break;
        case DP_FRAME_NAK: minimum = DP_NAK_LENGTH; break;
        case DP_FRAME_RTTM: minimum = DP_RTTM_LENGTH; break;
        case DP_FRAME_ERR: minimum = DP_ERR_HEADER_LENGTH; break;
        default:
            dp_counter_add(dp, DP_INVALID_PACKETS, 1);   /* not a frame a send channel takes */
            return;
    }
    if (!valid_control_frame(datagram, length, minimum))
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    const int32_t session_id = fa_read_i32(datagram + 8);
    const int32_t stream_id = fa_read_i32(datagram + 12);
    if (DP_FRAME_SM == type)
    {
        /* Negative offsets or windows are not a receiver's (frames.py refuses them). */
        if (fa_read_i32(datagram + 20) < 0 || fa_read_i32(datagram + 24) < 0)
        {
            dp_counter_add(dp, DP_INVALID_PACKETS, 1);
            return;
        }
        on_receiver_heard(endpoint, source, dp->now_ns);
        const uint8_t flags = (uint8_t)datagram[5];
        if (0 == session_id && 0 == stream_id && (flags & DP_SM_SEND_SETUP_FLAG))
        {
            /* A receiver announcing itself to a control address: every
             * publication here sends it a SETUP. */
            for (int32_t i = 0; i < endpoint->publication_count; i++)
            {
                on_status_message(dp, endpoint->publications[i], datagram, length);
            }
            return;
        }
    }
    dp_network_publication_t *publication = publication_of(endpoint, session_id, stream_id);
    if (NULL == publication)
    {
        /* A receiver that outlived its publication, or a forger: counted, not dropped unseen. */
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    switch (type)
    {
        case DP_FRAME_SM: on_status_message(dp, publication, datagram, length); break;
        case DP_FRAME_NAK: on_nak(dp, publication, datagram); break;
        case DP_FRAME_RTTM: on_rttm(dp, publication, datagram, source); break;
        default: on_error_frame(dp, publication, datagram, length); break;
    }
}

int32_t dp_send_endpoint_poll(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint)
{
    if (!dp_take_readable(dp, endpoint->fd))
    {
        return 0;
    }
    const int32_t received = fulmar_udp_receive_batch(endpoint->fd, dp->receive_buffer, DP_RECEIVE_SLOT_LENGTH,
                                                      DP_RECEIVE_BATCH, dp->receive_datagrams);
    if (received < 0)
    {
        /* ICMP port unreachable and the like surface here: the next send shows it too. */
        return 0;
    }
    for (int32_t i = 0; i < received; i++)
    {
        const fulmar_udp_datagram_t *datagram = &dp->receive_datagrams[i];
        const char *bytes = dp->receive_buffer + datagram->offset;
        int32_t length = datagram->length;
        /* Authenticated first: a forged status message, NAK or error frame
         * moves nothing, and a forged one announcing a receiver adds no
         * dynamic destination. */
        if (NULL != endpoint->mac_key &&
            !dp_authenticate(dp, endpoint->mac_key, bytes, &length, datagram->truncated, "send", endpoint->name,
                             &endpoint->next_refusal_report_ns))
        {
            continue;
        }
        if (dp_drop_incoming(dp, bytes, length))
        {
            continue;
        }
        dispatch(dp, endpoint, bytes, length, &datagram->source);
    }
    if (FULMAR_DP_CONTROL_DYNAMIC == endpoint->control_mode)
    {
        expire_destinations(dp, endpoint);
    }
    return received;
}

/* ---------------------------------------------------------------- publications */

int64_t dp_network_publication_producer_position(const dp_network_publication_t *publication)
{
    return fulmar_log_producer_position(publication->metadata, publication->config.term_length,
                                        publication->position_bits_to_shift, publication->config.initial_term_id);
}

int32_t dp_network_publication_is_eos_sent(const dp_network_publication_t *publication)
{
    return publication->is_closed && publication->sender_position >= dp_network_publication_producer_position(publication);
}

int32_t dp_network_publication_has_data(dp_network_publication_t *publication)
{
    const int64_t producer = dp_network_publication_producer_position(publication);
    const int64_t limit = producer < publication->sender_limit ? producer : publication->sender_limit;
    return limit > publication->sender_position ||
           (publication->readers.doorbell_count > 0 && producer != publication->relayed_position);
}

void dp_network_publication_update_connected(dp_network_publication_t *publication)
{
    const int32_t connected =
        fulmar_sender_timing_is_connected(&publication->timing, fulmar_fc_has_required_receivers(&publication->flow_control)) ||
        (publication->config.spies_simulate_connection && publication->readers.position_count > 0);
    if (connected != publication->is_connected)
    {
        publication->is_connected = connected;
        fa_store_i32(publication->metadata + DP_IS_CONNECTED_OFFSET, connected);
    }
}

int32_t dp_network_publication_init(fulmar_dp_t *dp, dp_network_publication_t *publication,
                                    const fulmar_dp_network_publication_t *config, dp_send_endpoint_t *endpoint)
{
    const int32_t term_length = config->term_length;
    if (NULL == config->log || term_length < 64 * 1024 || 0 != (term_length & (term_length - 1)) ||
        config->mtu < DP_HEADER_LENGTH || config->term_window_length <= 0)
    {
        return FULMAR_DP_INVALID;
    }
    int32_t result = dp_grow((void ***)&endpoint->publications, &endpoint->publication_capacity,
                             endpoint->publication_count);
    if (result < 0)
    {
        return result;
    }
    publication->config = *config;
    publication->endpoint = endpoint;
    publication->metadata = config->log + (int64_t)FULMAR_PARTITION_COUNT * term_length;
    publication->position_bits_to_shift = dp_position_bits(term_length);
    publication->sender_position = config->start_position;
    publication->sender_limit = config->start_position;
    publication->clean_position = config->start_position & ~(int64_t)(FULMAR_FRAME_ALIGNMENT - 1);
    publication->trip_gain = config->term_window_length / 8;
    publication->relayed_position = dp_network_publication_producer_position(publication);
    if (fulmar_fc_init(&publication->flow_control, config->flow_control, config->fc_receiver_timeout_ns,
                       config->fc_group_min_size, config->fc_group_tag) < 0)
    {
        return FULMAR_DP_INVALID;
    }
    if (fulmar_sender_timing_init(&publication->timing, fulmar_dp_now_ns(), FULMAR_PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS,
                                  FULMAR_PUBLICATION_SETUP_TIMEOUT_NS, FULMAR_PUBLICATION_HEARTBEAT_TIMEOUT_NS,
                                  config->initial_setup_interval_ns) < 0 ||
        fulmar_retransmit_init(&publication->retransmit, config->has_group_semantics, FULMAR_RETRANSMIT_MAX_RESEND_DEFAULT,
                               FULMAR_RETRANSMIT_DELAY_DEFAULT_NS, FULMAR_RETRANSMIT_LINGER_DEFAULT_NS) < 0)
    {
        fulmar_fc_close(&publication->flow_control);
        fulmar_sender_timing_close(&publication->timing);
        return FULMAR_DP_INVALID;
    }
    endpoint->publications[endpoint->publication_count++] = publication;
    /* A publication that starts mid-stream has sent nothing yet from there:
     * its counter says where sending starts, not 0. */
    dp_counter_set(dp, config->sender_position_id, config->start_position);
    return 0;
}

void dp_network_publication_close(dp_network_publication_t *publication)
{
    dp_send_endpoint_t *endpoint = publication->endpoint;
    for (int32_t i = 0; i < endpoint->publication_count; i++)
    {
        if (endpoint->publications[i] == publication)
        {
            endpoint->publications[i] = endpoint->publications[--endpoint->publication_count];
            break;
        }
    }
    fulmar_fc_close(&publication->flow_control);
    fulmar_sender_timing_close(&publication->timing);
    dp_readers_free(&publication->readers);
}

/* Publishers may run a term window ahead of what has been sent (and of the
 * slowest spy, which reads this log directly), while connected. */
int32_t dp_network_publication_update_limit(fulmar_dp_t *dp, dp_network_publication_t *publication)
{
    const int64_t producer_position = dp_network_publication_producer_position(publication);
    dp_counter_set(dp, publication->config.publisher_position_id, producer_position);
    publication->readers_behind = 0;
    if (publication->readers.doorbell_count > 0 && producer_position != publication->relayed_position)
    {
        publication->relayed_position = producer_position;
        dp_ring_beyond_table(dp, &publication->readers);
    }
    if (publication->is_connected)
    {
        const int64_t slowest_spy = dp_min_reader_position(dp, &publication->readers, publication->sender_position);
        const int64_t consumer_position =
            slowest_spy < publication->sender_position ? slowest_spy : publication->sender_position;
        publication->readers_behind = consumer_position < producer_position;
        const int64_t proposed = consumer_position + publication->config.term_window_length;
        if (proposed > publication->trip_limit)
        {
            /* Keep the term behind the slowest reader intact; clean older bytes. */
            const int64_t clean_to =
                (consumer_position - publication->config.term_length) & ~(int64_t)(FULMAR_FRAME_ALIGNMENT - 1);
            if (clean_to > publication->clean_position)
            {
                fulmar_log_clean(publication->config.log, publication->config.term_length,
                                 publication->clean_position, clean_to);
                publication->clean_position = clean_to;
            }
            dp_counter_set(dp, publication->config.publisher_limit_id, proposed);
            publication->trip_limit = proposed + publication->trip_gain;
            return 1;
        }
    }
    else if (dp_counter_get(dp, publication->config.publisher_limit_id) > publication->sender_position)
    {
        dp_counter_set(dp, publication->config.publisher_limit_id, publication->sender_position);
        publication->trip_limit = 0;
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- sending */

static int32_t max_message_length(int32_t term_length)
{
    const int32_t eighth = term_length / 8;
    return eighth < 16 * 1024 * 1024 ? eighth : 16 * 1024 * 1024;
}

/* Datagram regions (offset from the log's start, length) of whole committed
 * frames from position, at most limit_length bytes, within its term; returns
 * how many, and how far they advance the position in *advance. */
static int32_t collect_regions(const dp_network_publication_t *publication, int64_t position, int64_t limit_length,
                               int32_t *regions, int64_t *advance)
{
    return fulmar_term_pack_datagrams(publication->config.log, publication->config.term_length, position,
                                      limit_length, publication->config.mtu, DP_MAX_DATAGRAMS_PER_SEND, regions,
                                      advance);
}

static int64_t log_length(const dp_network_publication_t *publication)
{
    return (int64_t)FULMAR_PARTITION_COUNT * publication->config.term_length;
}

static int32_t send_data(fulmar_dp_t *dp, dp_network_publication_t *publication)
{
    const int64_t producer = dp_network_publication_producer_position(publication);
    const int64_t limit = producer < publication->sender_limit ? producer : publication->sender_limit;
    const int64_t position = publication->sender_position;
    if (limit <= position)
    {
        return 0;
    }
    int32_t regions[2 * DP_MAX_DATAGRAMS_PER_SEND];
    int64_t advance = 0;
    const int32_t count = collect_regions(publication, position, limit - position, regions, &advance);
    if (0 == count)
    {
        return 0;
    }
    int64_t bytes = 0;
    for (int32_t i = 0; i < count; i++)
    {
        bytes += regions[2 * i + 1];
    }
    send_regions(dp, publication->endpoint, publication->config.log, log_length(publication), regions, count);
    publication->sender_position = position + advance;
    dp_counter_set(dp, publication->config.sender_position_id, publication->sender_position);
    dp_counter_add(dp, DP_BYTES_SENT, bytes);
    return 1;
}

typedef struct resend_context_stct
{
    fulmar_dp_t *dp;
    dp_network_publication_t *publication;
}
resend_context_t;

/* Only data already sent is resent, and only while its slot in the log still
 * holds it: not older than half a term plus a maximum message behind the
 * sender (Aeron's bottom resend window), so a stale or forged NAK gets nothing. */
static void resend(void *argument, int32_t term_id, int32_t term_offset, int32_t length)
{
    resend_context_t *context = argument;
    dp_network_publication_t *publication = context->publication;
    const int32_t term_length = publication->config.term_length;
    const int64_t position = dp_compute_position(term_id, term_offset, publication->position_bits_to_shift,
                                                 publication->config.initial_term_id);
    const int64_t sender_position = publication->sender_position;
    const int64_t bottom = sender_position - (term_length >> 1) - max_message_length(term_length);
    if (position < bottom || position >= sender_position)
    {
        return;
    }
    const int64_t resend_length = length < sender_position - position ? length : sender_position - position;
    if (resend_length <= 0)
    {
        return;
    }
    int32_t regions[2 * DP_MAX_DATAGRAMS_PER_SEND];
    int64_t advance = 0;
    const int32_t count = collect_regions(publication, position, resend_length, regions, &advance);
    if (count > 0)
    {
        send_regions(context->dp, publication->endpoint, publication->config.log, log_length(publication), regions, count);
        dp_counter_add(context->dp, DP_RETRANSMITS_SENT, 1);
    }
}

static void position_fields(const dp_network_publication_t *publication, int32_t *term_id, int32_t *term_offset)
{
    const int64_t position = publication->sender_position;
    *term_id = (int32_t)((uint32_t)publication->config.initial_term_id +
                         (uint32_t)(position >> publication->position_bits_to_shift));
    *term_offset = (int32_t)(position & (publication->config.term_length - 1));
}

static void send_setup(fulmar_dp_t *dp, dp_network_publication_t *publication)
{
    char frame[DP_SETUP_LENGTH];
    int32_t term_id, term_offset;
    position_fields(publication, &term_id, &term_offset);
    const int32_t fields[8] = {
        term_offset, publication->config.session_id, publication->config.stream_id, publication->config.initial_term_id,
        term_id, publication->config.term_length, publication->config.mtu, publication->config.ttl,
    };
    const int32_t frame_length = DP_SETUP_LENGTH;
    const int16_t type = DP_FRAME_SETUP;
    memcpy(frame, &frame_length, 4);
    frame[4] = 0;   /* version */
    frame[5] = 0;   /* flags */
    memcpy(frame + 6, &type, 2);
    memcpy(frame + 8, fields, sizeof(fields));
    send_to_all(dp, publication->endpoint, frame, DP_SETUP_LENGTH);
}

static void send_heartbeat(fulmar_dp_t *dp, dp_network_publication_t *publication)
{
    char frame[DP_HEADER_LENGTH];
    int32_t term_id, term_offset;
    position_fields(publication, &term_id, &term_offset);
    const int32_t zero = 0;
    const int64_t reserved = 0;
    const int16_t type = DP_FRAME_DATA;
    memcpy(frame, &zero, 4);    /* a heartbeat is a DATA header of length 0 */
    frame[4] = 0;
    frame[5] = (char)(DP_UNFRAGMENTED | (dp_network_publication_is_eos_sent(publication) ? DP_EOS_FLAG : 0));
    memcpy(frame + 6, &type, 2);
    memcpy(frame + 8, &term_offset, 4);
    memcpy(frame + 12, &publication->config.session_id, 4);
    memcpy(frame + 16, &publication->config.stream_id, 4);
    memcpy(frame + 20, &term_id, 4);
    memcpy(frame + 24, &reserved, 8);
    send_to_all(dp, publication->endpoint, frame, DP_HEADER_LENGTH);
    dp_counter_add(dp, DP_HEARTBEATS_SENT, 1);
}

int32_t dp_network_publication_send(fulmar_dp_t *dp, dp_network_publication_t *publication)
{
    const int64_t now_ns = dp->now_ns;
    int32_t work = 0;
    const int32_t due = fulmar_sender_timing_setup_due(&publication->timing, now_ns);
    if (FULMAR_SETUP_NO != due)
    {
        if (FULMAR_SETUP_ELICITED == due)
        {
            publication->sender_limit = fulmar_fc_on_setup(&publication->flow_control, publication->sender_limit,
                                                           publication->sender_position,
                                                           publication->position_bits_to_shift, now_ns);
        }
        send_setup(dp, publication);
        work++;
    }
    if (send_data(dp, publication))
    {
        fulmar_sender_timing_on_data_sent(&publication->timing, now_ns);
        work++;
    }
    else
    {
        if (fulmar_sender_timing_heartbeat_due(&publication->timing, now_ns))
        {
            send_heartbeat(dp, publication);
            work++;
        }
        const int32_t eos_sent = dp_network_publication_is_eos_sent(publication);
        if (publication->config.spies_simulate_connection && publication->readers.position_count > 0 &&
            !publication->timing.has_receivers)
        {
            /* Spies alone connect it (ssc), and no receiver sends status
             * messages to open the window: as Aeron, the sender follows the
             * fastest spy, so the publisher limit (slowest spy plus a window)
             * keeps moving. */
            int64_t position = publication->sender_position;
            for (int32_t i = 0; i < publication->readers.position_count; i++)
            {
                const int64_t spy = dp_counter_get(dp, publication->readers.position_ids[i]);
                position = spy > position ? spy : position;
            }
            if (position != publication->sender_position)
            {
                publication->sender_position = position;
                dp_counter_set(dp, publication->config.sender_position_id, position);
            }
            publication->sender_limit = fulmar_fc_on_idle(&publication->flow_control, now_ns, position, position, eos_sent);
        }
        else
        {
            publication->sender_limit = fulmar_fc_on_idle(&publication->flow_control, now_ns, publication->sender_limit,
                                                          publication->sender_position, eos_sent);
        }
        fulmar_sender_timing_on_idle(&publication->timing, now_ns);
        dp_network_publication_update_connected(publication);
    }
    if (publication->retransmit.active_count > 0)
    {
        resend_context_t context = { dp, publication };
        work += fulmar_retransmit_process_timeouts(&publication->retransmit, now_ns, resend, &context);
    }
    dp_deadline(dp, fulmar_sender_timing_next_deadline_ns(&publication->timing));
    dp_deadline(dp, fulmar_retransmit_next_deadline_ns(&publication->retransmit));
    if (publication->readers_behind)
    {
        dp_deadline(dp, now_ns + dp->config.prompt_interval_ns);
    }
    return work;
}

/* ---------------------------------------------------------------- control frames */

static void on_status_message(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame, int32_t length)
{
    dp_counter_add(dp, DP_STATUS_MESSAGES_RECEIVED, 1);
    const uint8_t flags = (uint8_t)frame[5];
    const int64_t receiver_id = fa_read_i64(frame + 28);
    const int32_t has_group_tag = DP_SM_WITH_GROUP_TAG_LENGTH == fa_read_i32(frame) && length >= DP_SM_WITH_GROUP_TAG_LENGTH;
    const int64_t group_tag = has_group_tag ? fa_read_i64(frame + DP_SM_LENGTH) : 0;
    const int64_t now_ns = dp->now_ns;
    if (flags & DP_SM_SEND_SETUP_FLAG)
    {
        fulmar_sender_timing_on_trigger_send_setup(&publication->timing, now_ns,
                                                   dp_network_publication_is_eos_sent(publication));
        fulmar_fc_on_trigger_send_setup(&publication->flow_control, receiver_id, has_group_tag, group_tag, now_ns);
        return;
    }
    const int32_t is_eos = 0 != (flags & DP_SM_EOS_FLAG);
    publication->sender_limit = fulmar_fc_on_status_message(
        &publication->flow_control, fa_read_i32(frame + 16), fa_read_i32(frame + 20), fa_read_i32(frame + 24),
        receiver_id, has_group_tag, group_tag, publication->sender_limit, publication->config.initial_term_id,
        publication->position_bits_to_shift, now_ns, is_eos);
    fulmar_sender_timing_on_status_message(&publication->timing, receiver_id, is_eos, now_ns);
    dp_network_publication_update_connected(publication);
}

static void on_nak(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame)
{
    dp_counter_add(dp, DP_NAK_MESSAGES_RECEIVED, 1);
    const int32_t term_offset = fa_read_i32(frame + 20);
    const int32_t length = fa_read_i32(frame + 24);
    if (term_offset < 0 || length < 0)
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    const int64_t invalid_before = publication->retransmit.stats.invalid_naks;
    resend_context_t context = { dp, publication };
    fulmar_retransmit_on_nak(&publication->retransmit, &publication->flow_control, fa_read_i32(frame + 16),
                             term_offset, length, publication->config.term_length, dp->now_ns, resend, &context);
    if (publication->retransmit.stats.invalid_naks != invalid_before)
    {
        /* The handler ignores a NAK outside the term; the operator sees it here. */
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
    }
}

static void on_rttm(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame,
                    const fulmar_udp_address_t *source)
{
    if ((uint8_t)frame[5] & DP_RTTM_REPLY_FLAG)
    {
        /* This sender never asks for RTT measurements: a reply answers
         * nothing of ours, so it is counted rather than dropped unseen. */
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    char reply[DP_RTTM_LENGTH];
    const int32_t frame_length = DP_RTTM_LENGTH;
    const int16_t type = DP_FRAME_RTTM;
    const int64_t reception_delta_ns = 0;
    memcpy(reply, &frame_length, 4);
    reply[4] = 0;
    reply[5] = (char)DP_RTTM_REPLY_FLAG;
    memcpy(reply + 6, &type, 2);
    memcpy(reply + 8, &publication->config.session_id, 4);
    memcpy(reply + 12, &publication->config.stream_id, 4);
    memcpy(reply + 16, frame + 16, 8);      /* the echo timestamp */
    memcpy(reply + 24, &reception_delta_ns, 8);
    memcpy(reply + 32, frame + 32, 8);      /* the receiver id */
    const int error = dp_send_datagram(dp, publication->endpoint->fd, publication->endpoint->mac_key, reply,
                                       DP_RTTM_LENGTH, source);
    if (0 != error)
    {
        report_send_error(dp, publication->endpoint, source, error);
    }
}

static void on_error_frame(fulmar_dp_t *dp, dp_network_publication_t *publication, const char *frame, int32_t length)
{
    const int32_t frame_length = fa_read_i32(frame);
    const int32_t text_length = fa_read_i32(frame + 36);
    if (text_length < 0 || DP_ERR_HEADER_LENGTH + (int64_t)text_length > frame_length || frame_length > length)
    {
        dp_counter_add(dp, DP_INVALID_PACKETS, 1);
        return;
    }
    const int64_t receiver_id = fa_read_i64(frame + 16);
    const int32_t has_group_tag = 0 != ((uint8_t)frame[5] & DP_ERR_HAS_GROUP_TAG_FLAG);
    fulmar_sender_timing_on_error(&publication->timing, receiver_id);
    fulmar_fc_on_error(&publication->flow_control, receiver_id, has_group_tag,
                       has_group_tag ? fa_read_i64(frame + 24) : 0, dp->now_ns);
    dp_network_publication_update_connected(publication);
}
