/* The media driver's data plane: one native thread that sends network
 * publications, receives images, and moves IPC publishers' limits, without
 * the GIL.  The conductor (Python) keeps commands, counters' allocation,
 * errors and configuration; it opens and binds the sockets, maps the log
 * buffers and allocates the counters, then hands them to the data plane here.
 *
 * Threading.  Every call below takes the data plane's lock; the thread holds
 * it for a duty cycle (tens of microseconds), never while it sleeps.  After a
 * remove call returns, the thread no longer touches what was removed: the
 * conductor may then unmap the log or close the socket.
 *
 * Sleeping.  The thread sleeps in epoll on its sockets, on the read end of the
 * driver's data FIFO and on an eventfd the calls below write to.  Publishers
 * of UDP streams ring the data doorbell (fulmar_doorbell_ring_fifo): a word
 * in cnc.dat whose waiters field the thread sets before it sleeps, so that a
 * publisher writes to the FIFO only when the thread sleeps.  It wakes at its
 * next deadline otherwise: a SETUP, heartbeat, status message, NAK or
 * retransmit due, a linger to end, or while readers are behind their writers
 * (their progress rings nobody) every prompt interval.
 *
 * Ids.  Publications, images and endpoints are named by the conductor's own
 * ids (registration ids, correlation ids, endpoint ids), unique per kind.
 * Counters are named by their counter ids in the counters values buffer.
 *
 * Results: 0 (or a count) on success, else one of the FULMAR_DP_* codes. */

#define FULMAR_DP_UNKNOWN -1            /* no such id */
#define FULMAR_DP_EXISTS -2             /* the id is taken */
#define FULMAR_DP_NO_MEMORY -3
#define FULMAR_DP_INVALID -4            /* an argument out of range */
#define FULMAR_DP_FULL -5               /* a fixed table (transports, destinations) is full */

#define FULMAR_DP_CONTROL_UNICAST 0     /* one destination, the channel's endpoint */
#define FULMAR_DP_CONTROL_MANUAL 1      /* destinations the clients add and remove */
#define FULMAR_DP_CONTROL_DYNAMIC 2     /* every receiver whose status messages arrive */

#define FULMAR_DP_MAX_TRANSPORTS 16     /* per receive endpoint (multi-destination subscription) */
#define FULMAR_DP_MAX_DESTINATIONS 64   /* per send endpoint (multi-destination-cast) */
#define FULMAR_DP_MAX_STREAMS 64        /* streams subscribed on one receive endpoint */

/* Events the thread leaves for the conductor (it rings the conductor's doorbell). */
#define FULMAR_DP_EVENT_SETUP 1         /* a SETUP of a subscribed stream that has no image yet */
#define FULMAR_DP_EVENT_ERROR 2         /* something to record in the error log */
#define FULMAR_DP_EVENT_MESSAGE_LENGTH 256

typedef struct fulmar_dp_stct fulmar_dp_t;

typedef struct fulmar_dp_config_stct
{
    char *counters_values;          /* cnc.dat's counters values: positions and system counters */
    int64_t counters_values_length;
    char *conductor_doorbell;       /* the futex doorbell the conductor sleeps on (8 bytes) */
    char *data_doorbell;            /* the word publishers check before ringing data_doorbell_fd */
    int32_t data_doorbell_fd;       /* the FIFO's read end, non-blocking (the thread drains it) */
    int32_t reserved;
    int64_t idle_max_wait_ns;       /* the longest sleep when nothing is due */
    int64_t prompt_interval_ns;     /* the sleep while readers are behind their writers */
    int64_t spin_ns;                /* after a cycle with work, how long the thread polls on before it sleeps (0: never) */
    uint64_t loss_seed;             /* seeds the loss injector's two generators */
    /* The key of datagram-mac endpoints (HMAC-SHA256 over each datagram,
     * truncated to FULMAR_MAC_LENGTH bytes); has_datagram_key 0: no key,
     * and no such endpoint can be added. */
    uint8_t datagram_key[32];
    int32_t has_datagram_key;
    int32_t reserved2;
}
fulmar_dp_config_t;

typedef struct fulmar_dp_network_publication_stct
{
    int64_t registration_id;
    int64_t endpoint_id;            /* its send endpoint, added before */
    char *log;                      /* the mapped log buffer (terms, then metadata) */
    int32_t term_length;
    int32_t mtu;
    int32_t initial_term_id;
    int32_t session_id;
    int32_t stream_id;
    int32_t ttl;
    int64_t start_position;         /* where sending starts (the log's clean position) */
    int64_t term_window_length;     /* how far publishers may run ahead of the sender */
    int32_t publisher_limit_id;
    int32_t publisher_position_id;
    int32_t sender_position_id;
    int32_t flow_control;           /* FULMAR_FC_* */
    int64_t fc_receiver_timeout_ns;
    int64_t fc_group_tag;
    int32_t fc_group_min_size;
    int32_t has_group_semantics;    /* multicast or multi-destination: up to 16 retransmits at once */
    int32_t spies_simulate_connection;
    int32_t reserved;
    int64_t initial_setup_interval_ns;
}
fulmar_dp_network_publication_t;

typedef struct fulmar_dp_image_stct
{
    int64_t correlation_id;
    int64_t endpoint_id;            /* its receive endpoint */
    char *log;
    int32_t term_length;
    int32_t initial_term_id;
    int32_t session_id;
    int32_t stream_id;
    int32_t active_term_id;         /* the SETUP's position: where the image joins */
    int32_t term_offset;
    int32_t transport_index;        /* where the SETUP came in */
    int32_t receiver_hwm_id;
    int32_t receiver_position_id;
    int32_t initial_window_length;
    int64_t status_message_timeout_ns;
    int64_t image_liveness_timeout_ns;
    fulmar_udp_address_t source;    /* the sender's control address */
}
fulmar_dp_image_t;

typedef struct fulmar_dp_publication_status_stct
{
    int64_t sender_position;        /* network: what was sent; IPC: the consumers' furthest position */
    int64_t producer_position;
    int32_t is_connected;
    int32_t is_end_of_stream_sent;  /* network: closed, and everything up to its end was sent */
    int32_t retransmits_active;
    int32_t setup_backing_off;
}
fulmar_dp_publication_status_t;

typedef struct fulmar_dp_image_status_stct
{
    int64_t rebuild_position;
    int64_t hwm_position;
    int64_t time_of_last_packet_ns;
    int32_t is_end_of_stream;       /* the end of the stream arrived and everything before it */
    int32_t reserved;
}
fulmar_dp_image_status_t;

typedef struct fulmar_dp_event_stct
{
    int32_t type;
    int32_t transport_index;
    int64_t endpoint_id;
    fulmar_udp_address_t source;
    /* SETUP's fields */
    int32_t term_offset;
    int32_t session_id;
    int32_t stream_id;
    int32_t initial_term_id;
    int32_t active_term_id;
    int32_t term_length;
    int32_t mtu;
    int32_t ttl;
    char message[256];              /* ERROR: NUL-terminated */
}
fulmar_dp_event_t;

/* What the thread has done, for tests and benchmarks. */
typedef struct fulmar_dp_stats_stct
{
    int64_t duty_cycles;
    int64_t sleeps;                 /* times it went to sleep in epoll */
    int64_t planned_wait_ns;        /* how long it meant to sleep the last time it found nothing to do */
}
fulmar_dp_stats_t;

/* Starts the thread; NULL when it cannot (errno says why). */
fulmar_dp_t *fulmar_dp_start(const fulmar_dp_config_t *config);
/* Stops and joins the thread and frees the data plane; closes no socket. */
void fulmar_dp_stop(fulmar_dp_t *dp);

/* Send endpoints: a socket that sends publications and receives their
 * receivers' control frames.  name is for error messages (copied).
 *
 * datagram_mac (either kind of endpoint): every datagram sent from the
 * endpoint carries a trailer, the MAC of its bytes under the data plane's
 * datagram key, and every datagram received without a valid one is refused
 * before any of its frames is read (counted, and reported as an error).
 * FULMAR_DP_INVALID when the data plane has no key. */
int32_t fulmar_dp_add_send_endpoint(
    fulmar_dp_t *dp, int64_t endpoint_id, int32_t fd, int32_t control_mode,
    const fulmar_udp_address_t *destination, int32_t datagram_mac, const char *name);
int32_t fulmar_dp_add_destination(fulmar_dp_t *dp, int64_t endpoint_id, const fulmar_udp_address_t *destination);
/* 1 when it was there, 0 when not. */
int32_t fulmar_dp_remove_destination(fulmar_dp_t *dp, int64_t endpoint_id, const fulmar_udp_address_t *destination);

/* Receive endpoints: the sockets (transports) of a UDP subscription's channel. */
int32_t fulmar_dp_add_receive_endpoint(
    fulmar_dp_t *dp, int64_t endpoint_id, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag,
    const fulmar_udp_address_t *control, int32_t is_manual, int32_t datagram_mac, const char *name);
/* fd -1 takes the transport out (the conductor closes it after). */
int32_t fulmar_dp_set_transport(fulmar_dp_t *dp, int64_t endpoint_id, int32_t transport_index, int32_t fd);
/* The streams subscribed on the endpoint: data of others is counted invalid. */
int32_t fulmar_dp_set_streams(fulmar_dp_t *dp, int64_t endpoint_id, const int32_t *stream_ids, int32_t count);
/* Send or receive endpoint, once nothing uses it. */
int32_t fulmar_dp_remove_endpoint(fulmar_dp_t *dp, int64_t endpoint_id);

int32_t fulmar_dp_add_network_publication(fulmar_dp_t *dp, const fulmar_dp_network_publication_t *publication);
int32_t fulmar_dp_add_ipc_publication(
    fulmar_dp_t *dp, int64_t registration_id, char *log, int32_t term_length, int32_t initial_term_id,
    int64_t consumer_position, int64_t term_window_length, int32_t publisher_limit_id, int32_t publisher_position_id);
int32_t fulmar_dp_add_image(fulmar_dp_t *dp, const fulmar_dp_image_t *image);

/* Who reads a publication's or an image's log: the position counters of its
 * subscribers (spies for a network publication), and the doorbells of
 * readers that the log's reader table could not hold (rung after the
 * producer moved, or data landed, as the table's are by the writers). */
int32_t fulmar_dp_set_readers(
    fulmar_dp_t *dp, int64_t id, const int32_t *position_ids, int32_t position_count,
    const int32_t *doorbell_ids, int32_t doorbell_count);
/* The last publisher left: the stream ends at the producer position. */
int32_t fulmar_dp_close_publication(fulmar_dp_t *dp, int64_t registration_id);
/* A destination was added: greet it with a SETUP. */
int32_t fulmar_dp_trigger_setup(fulmar_dp_t *dp, int64_t registration_id);
/* Publication (network or IPC) or image. */
int32_t fulmar_dp_remove(fulmar_dp_t *dp, int64_t id);

int32_t fulmar_dp_publication_status(fulmar_dp_t *dp, int64_t registration_id, fulmar_dp_publication_status_t *status);
int32_t fulmar_dp_image_status(fulmar_dp_t *dp, int64_t correlation_id, fulmar_dp_image_status_t *status);

/* Takes up to max events, oldest first; returns how many.  Events that did
 * not fit the queue are counted in *dropped (SETUPs repeat; errors are lost). */
int32_t fulmar_dp_poll_events(fulmar_dp_t *dp, fulmar_dp_event_t *events, int32_t max, int64_t *dropped);
/* 1 when events wait: asked by a conductor that has registered to sleep, so
 * that an event whose ring found no sleeper is not missed. */
int32_t fulmar_dp_has_events(fulmar_dp_t *dp);

void fulmar_dp_stats(fulmar_dp_t *dp, fulmar_dp_stats_t *stats);

/* The data plane's clock (CLOCK_MONOTONIC, as Python's time.monotonic_ns). */
int64_t fulmar_dp_now_ns(void);
