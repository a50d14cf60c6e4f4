/* The data plane's own structures, shared by dataplane.c (thread, calls,
 * IPC), dp_send.c (send endpoints, network publications) and dp_receive.c
 * (receive endpoints, images).  Everything here is touched with dp->lock held. */
#ifndef FULMAR_DATAPLANE_INTERNAL_H
#define FULMAR_DATAPLANE_INTERNAL_H

#include <pthread.h>

#include "_common.h"
#include "udp.h"
#include "flow_control.h"
#include "sender_timing.h"
#include "retransmit.h"
#include "image_state.h"
#include "loss.h"
#include "dataplane.h"
#include "counters.h"
#include "doorbell.h"
#include "term.h"
#include "mac.h"

/* Frame types and flags of Aeron's protocol (PROTOCOL.md). */
#define DP_FRAME_PAD 0x00
#define DP_FRAME_DATA 0x01
#define DP_FRAME_NAK 0x02
#define DP_FRAME_SM 0x03
#define DP_FRAME_ERR 0x04
#define DP_FRAME_SETUP 0x05
#define DP_FRAME_RTTM 0x06
#define DP_HEADER_LENGTH 32
#define DP_SETUP_LENGTH 40
#define DP_SM_LENGTH 36
#define DP_SM_WITH_GROUP_TAG_LENGTH 44
#define DP_NAK_LENGTH 28
#define DP_RTTM_LENGTH 40
#define DP_ERR_HEADER_LENGTH 40
#define DP_SM_SEND_SETUP_FLAG 0x80
#define DP_SM_EOS_FLAG 0x40
#define DP_RTTM_REPLY_FLAG 0x80
#define DP_ERR_HAS_GROUP_TAG_FLAG 0x08
#define DP_EOS_FLAG 0x20
#define DP_UNFRAGMENTED 0xC0

/* Log buffer metadata (logbuffer.py). */
#define DP_END_OF_STREAM_POSITION_OFFSET 128
#define DP_IS_CONNECTED_OFFSET 136

/* System counter ids (driver/counters.py SystemCounter). */
#define DP_BYTES_SENT 0
#define DP_BYTES_RECEIVED 1
#define DP_NAK_MESSAGES_SENT 5
#define DP_NAK_MESSAGES_RECEIVED 6
#define DP_STATUS_MESSAGES_SENT 7
#define DP_STATUS_MESSAGES_RECEIVED 8
#define DP_HEARTBEATS_SENT 9
#define DP_HEARTBEATS_RECEIVED 10
#define DP_RETRANSMITS_SENT 11
#define DP_FLOW_CONTROL_UNDER_RUNS 12
#define DP_FLOW_CONTROL_OVER_RUNS 13
#define DP_INVALID_PACKETS 14
#define DP_ERRORS 15
#define DP_SHORT_SENDS 16
#define DP_SENDER_FLOW_CONTROL_LIMITS 18
#define DP_LOSS_RECEIVE_RATE_PPM 32
#define DP_LOSS_SEND_RATE_PPM 33
#define DP_LOSS_FRAME_TYPE_MASK 34
#define DP_DATAGRAMS_DROPPED_BY_LOSS_INJECTION 35
#define DP_DATAGRAMS_REFUSED_NO_MAC 36

#define DP_MAX_DATAGRAMS_PER_SEND 64
#define DP_RECEIVE_BATCH 64
/* The largest datagram plus its MAC (a frame batch is at most 65504 bytes,
 * the MAC 16 more) fits a slot: an unauthenticated datagram that does not
 * fit is cut, fails its check and is refused. */
#define DP_RECEIVE_SLOT_LENGTH (64 * 1024)
/* A flood of refused datagrams reports itself (an error event, an entry in
 * the conductor's distinct error log) at most this often per endpoint: the
 * counter counts every one, but an event per datagram would keep the
 * conductor busy writing the same entry and crowd the SETUPs out of the
 * event queue. */
#define DP_REFUSAL_REPORT_INTERVAL_NS 10000000LL
#define DP_EVENT_CAPACITY 256
/* A dynamic MDC destination silent this long is dropped (Aeron's DESTINATION_TIMEOUT). */
#define DP_DESTINATION_TIMEOUT_NS 5000000000LL
/* How often a dynamic MDC subscriber with no image announces itself to the control address. */
#define DP_ANNOUNCE_INTERVAL_NS 200000000LL

typedef struct dp_readers_stct
{
    int32_t *position_ids;          /* subscriber position counters; malloc'd, may be NULL */
    int64_t *positions;             /* scratch for their values, as many */
    int32_t position_count;
    int32_t doorbell_count;
    int32_t *doorbell_ids;          /* beyond the log's table; malloc'd, may be NULL */
}
dp_readers_t;

typedef struct dp_destination_stct
{
    fulmar_udp_address_t address;
    int64_t time_of_last_sm_ns;     /* dynamic destinations; -1 for manual/unicast ones */
}
dp_destination_t;

typedef struct dp_network_publication_stct dp_network_publication_t;

typedef struct dp_send_endpoint_stct
{
    int64_t id;
    int32_t fd;
    int32_t control_mode;
    char name[160];
    dp_destination_t destinations[FULMAR_DP_MAX_DESTINATIONS];
    int32_t destination_count;
    int32_t publication_count;
    dp_network_publication_t **publications;    /* the ones it sends; malloc'd */
    int32_t publication_capacity;
    int32_t reserved;
    const fulmar_mac_key_t *mac_key;            /* datagram-mac: the data plane's key; NULL: none */
    int64_t next_refusal_report_ns;
}
dp_send_endpoint_t;

struct dp_network_publication_stct
{
    fulmar_dp_network_publication_t config;
    dp_send_endpoint_t *endpoint;
    char *metadata;
    int32_t position_bits_to_shift;
    int32_t is_closed;              /* draining: the stream ends at end_of_stream_position */
    int64_t end_of_stream_position;
    int64_t sender_position;
    int64_t sender_limit;
    int64_t trip_limit;
    int64_t trip_gain;
    int64_t clean_position;         /* the log is zeroed below this */
    int64_t relayed_position;       /* producer position the beyond-table readers were last rung for */
    int32_t is_connected;
    int32_t readers_behind;
    fulmar_fc_t flow_control;
    fulmar_sender_timing_t timing;
    fulmar_retransmit_handler_t retransmit;
    dp_readers_t readers;
};

typedef struct dp_ipc_publication_stct
{
    int64_t registration_id;
    char *log;
    char *metadata;
    int32_t term_length;
    int32_t position_bits_to_shift;
    int32_t initial_term_id;
    int32_t publisher_limit_id;
    int32_t publisher_position_id;
    int32_t readers_behind;
    int64_t consumer_position;
    int64_t term_window_length;
    int64_t trip_limit;
    int64_t trip_gain;
    int64_t clean_position;
    int64_t relayed_position;
    dp_readers_t readers;
}
dp_ipc_publication_t;

typedef struct dp_image_stct dp_image_t;

typedef struct dp_receive_endpoint_stct
{
    int64_t id;
    int64_t receiver_id;
    int32_t has_group_tag;
    int32_t is_manual;
    int64_t group_tag;
    int32_t has_control;
    int32_t stream_count;
    fulmar_udp_address_t control;
    int64_t next_announce_ns;
    int32_t fds[FULMAR_DP_MAX_TRANSPORTS];      /* -1: no transport at that index */
    int32_t stream_ids[FULMAR_DP_MAX_STREAMS];
    int32_t image_count;
    int32_t image_capacity;
    dp_image_t **images;
    char name[160];
    const fulmar_mac_key_t *mac_key;            /* datagram-mac: the data plane's key; NULL: none */
    int64_t next_refusal_report_ns;
}
dp_receive_endpoint_t;

struct dp_image_stct
{
    fulmar_dp_image_t config;
    dp_receive_endpoint_t *endpoint;
    char *metadata;
    fulmar_image_state_t state;
    /* Where status messages and NAKs go: each source feeding the image, by transport. */
    fulmar_udp_address_t sources[FULMAR_DP_MAX_TRANSPORTS];
    int32_t has_source[FULMAR_DP_MAX_TRANSPORTS];
    /* Multi-destination: where each transport's source ended its stream (-1: not yet). */
    int64_t eos_positions[FULMAR_DP_MAX_TRANSPORTS];
    int64_t published_hwm;
    int64_t published_position;
    int32_t data_arrived;
    int32_t needs_prompt_cycles;
    dp_readers_t readers;
};

#define DP_READABLE_FDS 65536

struct fulmar_dp_stct
{
    pthread_mutex_t lock;
    int32_t conductor_waiting;      /* the conductor's calls waiting for the lock (atomic): the thread lets them go first */
    pthread_t thread;
    int32_t stop;
    int32_t epoll_fd;
    int32_t wake_fd;                /* eventfd: a call changed something the sleeping thread must see */
    int32_t data_doorbell_fd;
    fulmar_dp_config_t config;

    dp_send_endpoint_t **send_endpoints;
    int32_t send_endpoint_count, send_endpoint_capacity;
    dp_receive_endpoint_t **receive_endpoints;
    int32_t receive_endpoint_count, receive_endpoint_capacity;
    dp_network_publication_t **network_publications;
    int32_t network_publication_count, network_publication_capacity;
    dp_ipc_publication_t **ipc_publications;
    int32_t ipc_publication_count, ipc_publication_capacity;
    dp_image_t **images;
    int32_t image_count, image_capacity;

    fulmar_dp_event_t events[DP_EVENT_CAPACITY];
    int32_t event_head;             /* next to take */
    int32_t event_count;
    int64_t events_dropped;

    fulmar_loss_t loss_incoming;
    fulmar_loss_t loss_outgoing;

    fulmar_mac_key_t datagram_key;  /* prepared from config.datagram_key when it has one */

    /* Receive scratch: one batch of slots, reused by every socket. */
    char *receive_buffer;
    fulmar_udp_datagram_t receive_datagrams[DP_RECEIVE_BATCH];
    /* While a duty cycle runs: its time, and the earliest deadline it found. */
    int64_t now_ns;
    int64_t next_deadline_ns;
    fulmar_dp_stats_t stats;
    /* Which sockets epoll said are readable since they were last read: a
     * cycle reads those only, instead of asking every socket and getting
     * EAGAIN from most (a system call each).  Sockets past the table's
     * size are read every cycle. */
    uint8_t readable[DP_READABLE_FDS];
    int32_t readable_fresh;         /* the blocking wait just filled it: the next cycle need not ask */
};

static inline int32_t dp_take_readable(fulmar_dp_t *dp, int32_t fd)
{
    if (fd >= DP_READABLE_FDS)
    {
        return 1;
    }
    /* Level-triggered: a socket left with datagrams is reported again. */
    const int32_t readable = dp->readable[fd];
    dp->readable[fd] = 0;
    return readable;
}

/* dataplane.c: shared helpers */
int64_t *dp_counter(fulmar_dp_t *dp, int32_t counter_id);
void dp_counter_add(fulmar_dp_t *dp, int32_t counter_id, int64_t delta);
void dp_counter_set(fulmar_dp_t *dp, int32_t counter_id, int64_t value);
int64_t dp_counter_get(fulmar_dp_t *dp, int32_t counter_id);
void dp_deadline(fulmar_dp_t *dp, int64_t deadline_ns);
void dp_error(fulmar_dp_t *dp, const char *format, ...) __attribute__((format(printf, 2, 3)));
int32_t dp_push_event(fulmar_dp_t *dp, const fulmar_dp_event_t *event);
int32_t dp_drop_incoming(fulmar_dp_t *dp, const char *datagram, int32_t length);
int32_t dp_drop_outgoing(fulmar_dp_t *dp, const char *datagram, int32_t length);
/* Sends one datagram (loss injection applies), with its MAC after it when
 * mac_key is not NULL; the errno on failure, 0 otherwise. */
int dp_send_datagram(fulmar_dp_t *dp, int32_t fd, const fulmar_mac_key_t *mac_key, const char *datagram,
                     int32_t length, const fulmar_udp_address_t *to);
/* A received datagram of an endpoint with mac_key: 1 when its trailer is
 * the MAC of the bytes before it (*length is then the frames' length, the
 * trailer stripped); 0 when not (counted, reported under name). */
int32_t dp_authenticate(fulmar_dp_t *dp, const fulmar_mac_key_t *mac_key, const char *datagram, int32_t *length,
                        int32_t truncated, const char *kind, const char *name, int64_t *next_report_ns);
int64_t dp_min_reader_position(fulmar_dp_t *dp, const dp_readers_t *readers, int64_t otherwise);
void dp_ring_beyond_table(fulmar_dp_t *dp, const dp_readers_t *readers);
void dp_readers_free(dp_readers_t *readers);
int dp_address_equal(const fulmar_udp_address_t *a, const fulmar_udp_address_t *b);
const char *dp_address_text(const fulmar_udp_address_t *address, char *buffer, size_t length);
int64_t dp_compute_position(int32_t term_id, int32_t term_offset, int32_t bits, int32_t initial_term_id);
int32_t dp_position_bits(int32_t term_length);
int32_t dp_grow(void ***items, int32_t *capacity, int32_t count);

/* dp_send.c */
dp_send_endpoint_t *dp_send_endpoint_new(int64_t id, int32_t fd, int32_t control_mode,
                                         const fulmar_udp_address_t *destination,
                                         const fulmar_mac_key_t *mac_key, const char *name);
void dp_send_endpoint_free(dp_send_endpoint_t *endpoint);
int32_t dp_send_endpoint_poll(fulmar_dp_t *dp, dp_send_endpoint_t *endpoint);
int32_t dp_network_publication_init(fulmar_dp_t *dp, dp_network_publication_t *publication,
                                    const fulmar_dp_network_publication_t *config, dp_send_endpoint_t *endpoint);
void dp_network_publication_close(dp_network_publication_t *publication);
int32_t dp_network_publication_update_limit(fulmar_dp_t *dp, dp_network_publication_t *publication);
int32_t dp_network_publication_send(fulmar_dp_t *dp, dp_network_publication_t *publication);
int32_t dp_network_publication_has_data(dp_network_publication_t *publication);
int64_t dp_network_publication_producer_position(const dp_network_publication_t *publication);
int32_t dp_network_publication_is_eos_sent(const dp_network_publication_t *publication);
void dp_network_publication_update_connected(dp_network_publication_t *publication);

/* dp_receive.c */
dp_receive_endpoint_t *dp_receive_endpoint_new(int64_t id, int64_t receiver_id, int32_t has_group_tag,
                                               int64_t group_tag, const fulmar_udp_address_t *control,
                                               int32_t is_manual, const fulmar_mac_key_t *mac_key,
                                               const char *name);
void dp_receive_endpoint_free(dp_receive_endpoint_t *endpoint);
int32_t dp_receive_endpoint_poll(fulmar_dp_t *dp, dp_receive_endpoint_t *endpoint);
int32_t dp_image_init(fulmar_dp_t *dp, dp_image_t *image, const fulmar_dp_image_t *config, dp_receive_endpoint_t *endpoint);
void dp_image_close(dp_image_t *image);
int32_t dp_image_do_work(fulmar_dp_t *dp, dp_image_t *image);
void dp_image_transport_removed(dp_image_t *image, int32_t transport_index);

#endif
