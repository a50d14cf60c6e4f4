/* The data plane's thread, its calls, IPC publications and loss injection;
 * see dataplane.h for the contract.  Sending is dp_send.c's, receiving
 * dp_receive.c's. */
#define _GNU_SOURCE
#include "_dataplane.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DP_EPOLL_EVENTS 64
/* Shorter sleeps than this are not worth a system call: the cycle runs again. */
#define DP_MIN_SLEEP_NS 20000LL

int64_t fulmar_dp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---------------------------------------------------------------- shared helpers */

int64_t *dp_counter(fulmar_dp_t *dp, int32_t counter_id)
{
    if (counter_id < 0 ||
        ((int64_t)counter_id + 1) * FULMAR_COUNTER_LENGTH > dp->config.counters_values_length)
    {
        return NULL;
    }
    return (int64_t *)(dp->config.counters_values + (int64_t)counter_id * FULMAR_COUNTER_LENGTH);
}

void dp_counter_add(fulmar_dp_t *dp, int32_t counter_id, int64_t delta)
{
    int64_t *counter = dp_counter(dp, counter_id);
    if (NULL != counter)
    {
        fa_get_and_add_i64(counter, delta);
    }
}

void dp_counter_set(fulmar_dp_t *dp, int32_t counter_id, int64_t value)
{
    int64_t *counter = dp_counter(dp, counter_id);
    if (NULL != counter)
    {
        fa_store_i64(counter, value);
    }
}

int64_t dp_counter_get(fulmar_dp_t *dp, int32_t counter_id)
{
    int64_t *counter = dp_counter(dp, counter_id);
    return NULL == counter ? 0 : fa_load_i64(counter);
}

void dp_deadline(fulmar_dp_t *dp, int64_t deadline_ns)
{
    /* What is due now was done in this cycle, or waits for something else (a
     * timed-out image waits for the conductor): only future deadlines wake. */
    if (deadline_ns > dp->now_ns && deadline_ns < dp->next_deadline_ns)
    {
        dp->next_deadline_ns = deadline_ns;
    }
}

int32_t dp_push_event(fulmar_dp_t *dp, const fulmar_dp_event_t *event)
{
    if (dp->event_count >= DP_EVENT_CAPACITY)
    {
        dp->events_dropped++;
        return 0;
    }
    dp->events[(dp->event_head + dp->event_count) % DP_EVENT_CAPACITY] = *event;
    dp->event_count++;
    if (NULL != dp->config.conductor_doorbell)
    {
        fulmar_doorbell_ring(dp->config.conductor_doorbell, 0);
    }
    return 1;
}

void dp_error(fulmar_dp_t *dp, const char *format, ...)
{
    fulmar_dp_event_t event;
    memset(&event, 0, sizeof(event));
    event.type = FULMAR_DP_EVENT_ERROR;
    va_list args;
    va_start(args, format);
    vsnprintf(event.message, sizeof(event.message), format, args);
    va_end(args);
    dp_push_event(dp, &event);
}

int dp_address_equal(const fulmar_udp_address_t *a, const fulmar_udp_address_t *b)
{
    if (a->family != b->family || a->port != b->port || a->scope_id != b->scope_id)
    {
        return 0;
    }
    return 0 == memcmp(a->address, b->address, AF_INET6 == a->family ? 16 : 4);
}

const char *dp_address_text(const fulmar_udp_address_t *address, char *buffer, size_t length)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (AF_INET == address->family || AF_INET6 == address->family)
    {
        inet_ntop(address->family, address->address, host, sizeof(host));
    }
    snprintf(buffer, length, AF_INET6 == address->family ? "[%s]:%d" : "%s:%d", host, address->port);
    return buffer;
}

int64_t dp_compute_position(int32_t term_id, int32_t term_offset, int32_t bits, int32_t initial_term_id)
{
    /* Term ids wrap: the count of terms is their int32 difference, negative
     * before the initial term (multiplied, not shifted: defined for those). */
    const int64_t term_count = (int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
    return term_count * ((int64_t)1 << bits) + term_offset;
}

int32_t dp_position_bits(int32_t term_length)
{
    return __builtin_ctz((uint32_t)term_length);
}

int32_t dp_grow(void ***items, int32_t *capacity, int32_t count)
{
    if (count < *capacity)
    {
        return 0;
    }
    const int32_t new_capacity = 0 == *capacity ? 8 : 2 * *capacity;
    void **grown = realloc(*items, sizeof(void *) * (size_t)new_capacity);
    if (NULL == grown)
    {
        return FULMAR_DP_NO_MEMORY;
    }
    *items = grown;
    *capacity = new_capacity;
    return 0;
}

static void remove_at(void **items, int32_t *count, int32_t index)
{
    memmove(items + index, items + index + 1, sizeof(void *) * (size_t)(*count - index - 1));
    (*count)--;
}

int64_t dp_min_reader_position(fulmar_dp_t *dp, const dp_readers_t *readers, int64_t otherwise)
{
    if (0 == readers->position_count)
    {
        return otherwise;
    }
    int64_t minimum = INT64_MAX;
    for (int32_t i = 0; i < readers->position_count; i++)
    {
        const int64_t position = dp_counter_get(dp, readers->position_ids[i]);
        if (position < minimum)
        {
            minimum = position;
        }
    }
    return minimum;
}

void dp_ring_beyond_table(fulmar_dp_t *dp, const dp_readers_t *readers)
{
    if (readers->doorbell_count > 0)
    {
        fulmar_doorbell_ring_ids(dp->config.counters_values, dp->config.counters_values_length,
                                 readers->doorbell_ids, readers->doorbell_count);
    }
}

void dp_readers_free(dp_readers_t *readers)
{
    free(readers->position_ids);
    free(readers->positions);
    free(readers->doorbell_ids);
    readers->position_ids = NULL;
    readers->positions = NULL;
    readers->doorbell_ids = NULL;
    readers->doorbell_count = 0;
    readers->position_count = 0;
}

/* ---------------------------------------------------------------- loss injection */

static int32_t drop(fulmar_dp_t *dp, fulmar_loss_t *loss, int32_t rate_id, const char *datagram, int32_t length)
{
    const int64_t rate = dp_counter_get(dp, rate_id);
    if (rate <= 0)
    {
        return 0;   /* loss off: one counter read */
    }
    if (!fulmar_loss_drop(loss, rate, dp_counter_get(dp, DP_LOSS_FRAME_TYPE_MASK), datagram, length))
    {
        return 0;
    }
    dp_counter_add(dp, DP_DATAGRAMS_DROPPED_BY_LOSS_INJECTION, 1);
    return 1;
}

int32_t dp_drop_incoming(fulmar_dp_t *dp, const char *datagram, int32_t length)
{
    return drop(dp, &dp->loss_incoming, DP_LOSS_RECEIVE_RATE_PPM, datagram, length);
}

int32_t dp_drop_outgoing(fulmar_dp_t *dp, const char *datagram, int32_t length)
{
    return drop(dp, &dp->loss_outgoing, DP_LOSS_SEND_RATE_PPM, datagram, length);
}

int dp_send_datagram(fulmar_dp_t *dp, int32_t fd, const fulmar_mac_key_t *mac_key, const char *datagram,
                     int32_t length, const fulmar_udp_address_t *to)
{
    if (dp_drop_outgoing(dp, datagram, length))
    {
        return 0;
    }
    const int32_t region[2] = { 0, length };
    uint8_t mac[FULMAR_MAC_LENGTH];
    if (NULL != mac_key)
    {
        fulmar_mac2(mac_key, (const uint8_t *)datagram, length, NULL, 0, mac);
    }
    const int32_t sent = fulmar_udp_send_batch(fd, datagram, length, region, 1, NULL != mac_key ? mac : NULL,
                                               FULMAR_MAC_LENGTH, to);
    if (sent < 0)
    {
        return -sent;
    }
    if (0 == sent)
    {
        dp_counter_add(dp, DP_SHORT_SENDS, 1);
    }
    return 0;
}

int32_t dp_authenticate(fulmar_dp_t *dp, const fulmar_mac_key_t *mac_key, const char *datagram, int32_t *length,
                        int32_t truncated, const char *kind, const char *name, int64_t *next_report_ns)
{
    /* A replay of a genuine datagram passes: DATA lands at its own position
     * (a copy of what is there, or a repair), a SETUP or status message says
     * again what was said, a NAK asks for a retransmit within the window the
     * sender keeps anyway.  So no sequence numbers are kept. */
    const int32_t frames_length = *length - FULMAR_MAC_LENGTH;
    if (!truncated && frames_length > 0 &&
        fulmar_mac2_check(mac_key, (const uint8_t *)datagram, frames_length, NULL, 0,
                          (const uint8_t *)datagram + frames_length))
    {
        *length = frames_length;
        return 1;
    }
    dp_counter_add(dp, DP_DATAGRAMS_REFUSED_NO_MAC, 1);
    if (dp->now_ns >= *next_report_ns)
    {
        /* One text per endpoint whoever sent it (no address, no length), so
         * that a flood is one entry of the distinct error log. */
        *next_report_ns = dp->now_ns + DP_REFUSAL_REPORT_INTERVAL_NS;
        dp_error(dp, "%s channel %s: datagram refused: no valid MAC (datagram-mac=true)", kind, name);
    }
    return 0;
}

/* ---------------------------------------------------------------- IPC publications */

static int64_t ipc_producer_position(const dp_ipc_publication_t *publication)
{
    return fulmar_log_producer_position(publication->metadata, publication->term_length,
                                        publication->position_bits_to_shift, publication->initial_term_id);
}

/* The publishers' limit: a window beyond the slowest subscriber, the log
 * cleaned a term behind it (as IpcPublication.update_publisher_limit). */
static int32_t ipc_update_limit(fulmar_dp_t *dp, dp_ipc_publication_t *publication)
{
    const int64_t producer_position = ipc_producer_position(publication);
    dp_counter_set(dp, publication->publisher_position_id, producer_position);
    publication->readers_behind = 0;
    if (publication->readers.position_count > 0)
    {
        int64_t minimum = INT64_MAX;
        int64_t maximum = INT64_MIN;
        for (int32_t i = 0; i < publication->readers.position_count; i++)
        {
            const int64_t position = dp_counter_get(dp, publication->readers.position_ids[i]);
            minimum = position < minimum ? position : minimum;
            maximum = position > maximum ? position : maximum;
        }
        publication->readers_behind = minimum < producer_position;
        if (maximum > publication->consumer_position)
        {
            publication->consumer_position = maximum;
        }
        const int64_t proposed = minimum + publication->term_window_length;
        if (proposed > publication->trip_limit)
        {
            const int64_t clean_to = (minimum - publication->term_length) & ~(int64_t)(FULMAR_FRAME_ALIGNMENT - 1);
            if (clean_to > publication->clean_position)
            {
                fulmar_log_clean(publication->log, publication->term_length, publication->clean_position, clean_to);
                publication->clean_position = clean_to;
            }
            dp_counter_set(dp, publication->publisher_limit_id, proposed);
            publication->trip_limit = proposed + publication->trip_gain;
            return 1;
        }
    }
    else if (dp_counter_get(dp, publication->publisher_limit_id) > publication->consumer_position)
    {
        dp_counter_set(dp, publication->publisher_limit_id, publication->consumer_position);
        publication->trip_limit = 0;
        return 1;
    }
    return 0;
}

static int32_t ipc_relay(fulmar_dp_t *dp, dp_ipc_publication_t *publication)
{
    if (0 == publication->readers.doorbell_count)
    {
        return 0;
    }
    const int64_t position = ipc_producer_position(publication);
    if (position == publication->relayed_position)
    {
        return 0;
    }
    publication->relayed_position = position;
    dp_ring_beyond_table(dp, &publication->readers);
    return 1;
}

/* ---------------------------------------------------------------- the duty cycle */

static int32_t duty_cycle(fulmar_dp_t *dp)
{
    int32_t work = 0;
    dp->stats.duty_cycles++;
    dp->now_ns = fulmar_dp_now_ns();
    dp->next_deadline_ns = dp->now_ns + dp->config.idle_max_wait_ns;

    for (int32_t i = 0; i < dp->receive_endpoint_count; i++)
    {
        work += dp_receive_endpoint_poll(dp, dp->receive_endpoints[i]);
    }
    for (int32_t i = 0; i < dp->send_endpoint_count; i++)
    {
        work += dp_send_endpoint_poll(dp, dp->send_endpoints[i]);
    }
    for (int32_t i = 0; i < dp->network_publication_count; i++)
    {
        dp_network_publication_t *publication = dp->network_publications[i];
        work += dp_network_publication_update_limit(dp, publication);
        work += dp_network_publication_send(dp, publication);
    }
    for (int32_t i = 0; i < dp->ipc_publication_count; i++)
    {
        dp_ipc_publication_t *publication = dp->ipc_publications[i];
        work += ipc_update_limit(dp, publication);
        work += ipc_relay(dp, publication);
        if (publication->readers_behind)
        {
            dp_deadline(dp, dp->now_ns + dp->config.prompt_interval_ns);
        }
    }
    for (int32_t i = 0; i < dp->image_count; i++)
    {
        work += dp_image_do_work(dp, dp->images[i]);
    }
    /* The readers of images that got data may be asleep.  Rung last: waking
     * them can hand them this core at once, and the cycle's own sends
     * (status messages, NAKs) should not wait behind them. */
    for (int32_t i = 0; i < dp->image_count; i++)
    {
        dp_image_t *image = dp->images[i];
        if (image->data_arrived)
        {
            image->data_arrived = 0;
            fulmar_log_ring_readers(image->metadata, dp->config.counters_values, dp->config.counters_values_length);
            dp_ring_beyond_table(dp, &image->readers);
        }
    }
    return work;
}

/* Is there anything a publisher appended that the sleeping thread would
 * miss?  Asked after registering as a sleeper on the data doorbell. */
static int32_t has_appended_work(fulmar_dp_t *dp)
{
    for (int32_t i = 0; i < dp->network_publication_count; i++)
    {
        if (dp_network_publication_has_data(dp->network_publications[i]))
        {
            return 1;
        }
    }
    for (int32_t i = 0; i < dp->ipc_publication_count; i++)
    {
        dp_ipc_publication_t *publication = dp->ipc_publications[i];
        if (publication->readers.doorbell_count > 0 && ipc_producer_position(publication) != publication->relayed_position)
        {
            return 1;
        }
    }
    return 0;
}

static void drain_wake_fd(fulmar_dp_t *dp)
{
    uint64_t value;
    while (read(dp->wake_fd, &value, sizeof(value)) > 0)
    {
    }
}

/* Marks the sockets epoll reported readable; drains the wake-up eventfd. */
static void note_readable(fulmar_dp_t *dp, const struct epoll_event *ready, int count)
{
    for (int i = 0; i < count; i++)
    {
        const int32_t fd = ready[i].data.fd;
        if (fd == dp->wake_fd)
        {
            drain_wake_fd(dp);
        }
        else if (fd >= 0 && fd < DP_READABLE_FDS)
        {
            dp->readable[fd] = 1;
        }
    }
}

/* The conductor's calls take the lock through here.  The thread lets go of
 * it and takes it again within nanoseconds between duty cycles (while it has
 * work, and while it spins), so a caller woken when it let go would mostly
 * find it taken again: the count makes the thread wait for them instead. */
static void conductor_lock(fulmar_dp_t *dp)
{
    __atomic_add_fetch(&dp->conductor_waiting, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&dp->lock);
    __atomic_sub_fetch(&dp->conductor_waiting, 1, __ATOMIC_SEQ_CST);
}

static void *run(void *argument)
{
    fulmar_dp_t *dp = argument;
    struct epoll_event ready[DP_EPOLL_EVENTS];
    char *doorbell = dp->config.data_doorbell;
    int64_t spin_until_ns = 0;

    for (;;)
    {
        while (__atomic_load_n(&dp->conductor_waiting, __ATOMIC_SEQ_CST) > 0)
        {
            sched_yield();  /* a conductor's call goes first (conductor_lock) */
        }
        pthread_mutex_lock(&dp->lock);
        if (dp->stop)
        {
            pthread_mutex_unlock(&dp->lock);
            break;
        }
        if (!dp->readable_fresh)
        {
            note_readable(dp, ready, epoll_wait(dp->epoll_fd, ready, DP_EPOLL_EVENTS, 0));
        }
        dp->readable_fresh = 0;
        const int32_t work = duty_cycle(dp);
        const int64_t deadline_ns = dp->next_deadline_ns;
        const int64_t cycle_ns = dp->now_ns;
        pthread_mutex_unlock(&dp->lock);
        if (work > 0)
        {
            spin_until_ns = cycle_ns + dp->config.spin_ns;
            continue;   /* more may be waiting: each cycle takes a bounded batch */
        }
        if (cycle_ns < spin_until_ns)
        {
            /* Spinning (opt-in): the answer to what was just sent or
             * delivered often comes within microseconds, and a poll costs
             * less than the wake-up a sleep would need.  The doorbell's word
             * says awake meanwhile, so publishers skip the FIFO's write.
             * Each poll yields first: a process woken onto this core (under
             * SCHED_BATCH it would not preempt) runs before the next one. */
            sched_yield();
            continue;
        }

        if (NULL != doorbell)
        {
            fulmar_doorbell_fifo_prepare(doorbell, 0);
        }
        pthread_mutex_lock(&dp->lock);
        const int32_t appended = has_appended_work(dp) || dp->stop;
        const int64_t wait_ns = deadline_ns - fulmar_dp_now_ns();
        if (!appended)
        {
            dp->stats.planned_wait_ns = wait_ns;
            dp->stats.sleeps += wait_ns >= DP_MIN_SLEEP_NS;
        }
        pthread_mutex_unlock(&dp->lock);
        if (!appended)
        {
            if (wait_ns >= DP_MIN_SLEEP_NS)
            {
                /* epoll counts in milliseconds: round up, a late wake is
                 * harmless and an early one only costs a cycle. */
                const int timeout_ms = (int)((wait_ns + 999999) / 1000000);
                const int count = epoll_wait(dp->epoll_fd, ready, DP_EPOLL_EVENTS, timeout_ms);
                /* The readable table is this thread's alone: no lock. */
                note_readable(dp, ready, count);
                dp->readable_fresh = 1;
            }
        }
        if (NULL != doorbell)
        {
            fulmar_doorbell_fifo_done(doorbell, 0, dp->data_doorbell_fd);
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- life cycle */

static void wake(fulmar_dp_t *dp)
{
    const uint64_t one = 1;
    ssize_t written = write(dp->wake_fd, &one, sizeof(one));
    (void)written;  /* a full counter already wakes the thread */
}

static int watch_fd(fulmar_dp_t *dp, int32_t fd)
{
    struct epoll_event event = { .events = EPOLLIN, .data.fd = fd };
    if (epoll_ctl(dp->epoll_fd, EPOLL_CTL_ADD, fd, &event) < 0 && EEXIST != errno)
    {
        return -errno;
    }
    return 0;
}

static void unwatch_fd(fulmar_dp_t *dp, int32_t fd)
{
    epoll_ctl(dp->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
}

fulmar_dp_t *fulmar_dp_start(const fulmar_dp_config_t *config)
{
    fulmar_dp_t *dp = calloc(1, sizeof(fulmar_dp_t));
    if (NULL == dp)
    {
        return NULL;
    }
    dp->config = *config;
    if (config->has_datagram_key)
    {
        fulmar_mac_key_init(&dp->datagram_key, config->datagram_key, (int32_t)sizeof(config->datagram_key));
    }
    /* The raw key is not needed past here: only its prepared form stays. */
    memset(dp->config.datagram_key, 0, sizeof(dp->config.datagram_key));
    dp->data_doorbell_fd = config->data_doorbell_fd;
    dp->epoll_fd = -1;
    dp->wake_fd = -1;
    /* One generator per direction, so that neither perturbs the other's sequence. */
    fulmar_loss_init(&dp->loss_incoming, config->loss_seed ^ 0x696E636F6D696E67ULL);   /* "incoming" */
    fulmar_loss_init(&dp->loss_outgoing, config->loss_seed ^ 0x6F7574676F696E67ULL);   /* "outgoing" */
    /* An anonymous mapping: pages no datagram reaches are never touched. */
    dp->receive_buffer = mmap(NULL, (size_t)DP_RECEIVE_BATCH * DP_RECEIVE_SLOT_LENGTH, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int error = 0;
    if (MAP_FAILED == dp->receive_buffer)
    {
        error = errno;
        dp->receive_buffer = NULL;
        goto failed;
    }
    if ((dp->epoll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (dp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
    {
        error = errno;
        goto failed;
    }
    if (watch_fd(dp, dp->wake_fd) < 0 || (dp->data_doorbell_fd >= 0 && watch_fd(dp, dp->data_doorbell_fd) < 0))
    {
        error = errno;
        goto failed;
    }
    if (0 != (error = pthread_mutex_init(&dp->lock, NULL)))
    {
        goto failed;
    }
    if (0 != (error = pthread_create(&dp->thread, NULL, run, dp)))
    {
        pthread_mutex_destroy(&dp->lock);
        goto failed;
    }
    return dp;

failed:
    if (dp->epoll_fd >= 0)
    {
        close(dp->epoll_fd);
    }
    if (dp->wake_fd >= 0)
    {
        close(dp->wake_fd);
    }
    if (NULL != dp->receive_buffer)
    {
        munmap(dp->receive_buffer, (size_t)DP_RECEIVE_BATCH * DP_RECEIVE_SLOT_LENGTH);
    }
    free(dp);
    errno = error;
    return NULL;
}

void fulmar_dp_stop(fulmar_dp_t *dp)
{
    if (NULL == dp)
    {
        return;
    }
    conductor_lock(dp);
    dp->stop = 1;
    pthread_mutex_unlock(&dp->lock);
    wake(dp);
    pthread_join(dp->thread, NULL);

    for (int32_t i = 0; i < dp->network_publication_count; i++)
    {
        dp_network_publication_close(dp->network_publications[i]);
        free(dp->network_publications[i]);
    }
    for (int32_t i = 0; i < dp->ipc_publication_count; i++)
    {
        dp_readers_free(&dp->ipc_publications[i]->readers);
        free(dp->ipc_publications[i]);
    }
    for (int32_t i = 0; i < dp->image_count; i++)
    {
        dp_image_close(dp->images[i]);
        free(dp->images[i]);
    }
    for (int32_t i = 0; i < dp->send_endpoint_count; i++)
    {
        dp_send_endpoint_free(dp->send_endpoints[i]);
    }
    for (int32_t i = 0; i < dp->receive_endpoint_count; i++)
    {
        dp_receive_endpoint_free(dp->receive_endpoints[i]);
    }
    free(dp->network_publications);
    free(dp->ipc_publications);
    free(dp->images);
    free(dp->send_endpoints);
    free(dp->receive_endpoints);
    close(dp->epoll_fd);
    close(dp->wake_fd);
    munmap(dp->receive_buffer, (size_t)DP_RECEIVE_BATCH * DP_RECEIVE_SLOT_LENGTH);
    pthread_mutex_destroy(&dp->lock);
    free(dp);
}

/* ---------------------------------------------------------------- lookups */

static int32_t find_send_endpoint(fulmar_dp_t *dp, int64_t id)
{
    for (int32_t i = 0; i < dp->send_endpoint_count; i++)
    {
        if (dp->send_endpoints[i]->id == id)
        {
            return i;
        }
    }
    return -1;
}

static int32_t find_receive_endpoint(fulmar_dp_t *dp, int64_t id)
{
    for (int32_t i = 0; i < dp->receive_endpoint_count; i++)
    {
        if (dp->receive_endpoints[i]->id == id)
        {
            return i;
        }
    }
    return -1;
}

static int32_t find_network_publication(fulmar_dp_t *dp, int64_t id)
{
    for (int32_t i = 0; i < dp->network_publication_count; i++)
    {
        if (dp->network_publications[i]->config.registration_id == id)
        {
            return i;
        }
    }
    return -1;
}

static int32_t find_ipc_publication(fulmar_dp_t *dp, int64_t id)
{
    for (int32_t i = 0; i < dp->ipc_publication_count; i++)
    {
        if (dp->ipc_publications[i]->registration_id == id)
        {
            return i;
        }
    }
    return -1;
}

static int32_t find_image(fulmar_dp_t *dp, int64_t id)
{
    for (int32_t i = 0; i < dp->image_count; i++)
    {
        if (dp->images[i]->config.correlation_id == id)
        {
            return i;
        }
    }
    return -1;
}

static int32_t id_taken(fulmar_dp_t *dp, int64_t id)
{
    return find_network_publication(dp, id) >= 0 || find_ipc_publication(dp, id) >= 0 || find_image(dp, id) >= 0;
}

/* ---------------------------------------------------------------- endpoints */

int32_t fulmar_dp_add_send_endpoint(
    fulmar_dp_t *dp, int64_t endpoint_id, int32_t fd, int32_t control_mode,
    const fulmar_udp_address_t *destination, int32_t datagram_mac, const char *name)
{
    if (fd < 0 || control_mode < FULMAR_DP_CONTROL_UNICAST || control_mode > FULMAR_DP_CONTROL_DYNAMIC ||
        (FULMAR_DP_CONTROL_UNICAST == control_mode && NULL == destination) ||
        (datagram_mac && !dp->config.has_datagram_key))
    {
        return FULMAR_DP_INVALID;
    }
    int32_t result = 0;
    conductor_lock(dp);
    if (find_send_endpoint(dp, endpoint_id) >= 0 || find_receive_endpoint(dp, endpoint_id) >= 0)
    {
        result = FULMAR_DP_EXISTS;
    }
    else if (0 == (result = dp_grow((void ***)&dp->send_endpoints, &dp->send_endpoint_capacity, dp->send_endpoint_count)))
    {
        dp_send_endpoint_t *endpoint = dp_send_endpoint_new(endpoint_id, fd, control_mode, destination,
                                                             datagram_mac ? &dp->datagram_key : NULL, name);
        if (NULL == endpoint)
        {
            result = FULMAR_DP_NO_MEMORY;
        }
        else if ((result = watch_fd(dp, fd)) < 0)
        {
            dp_send_endpoint_free(endpoint);
        }
        else
        {
            dp->send_endpoints[dp->send_endpoint_count++] = endpoint;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_add_destination(fulmar_dp_t *dp, int64_t endpoint_id, const fulmar_udp_address_t *destination)
{
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t index = find_send_endpoint(dp, endpoint_id);
    if (index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else
    {
        dp_send_endpoint_t *endpoint = dp->send_endpoints[index];
        int32_t present = 0;
        for (int32_t i = 0; i < endpoint->destination_count; i++)
        {
            present |= dp_address_equal(&endpoint->destinations[i].address, destination);
        }
        if (FULMAR_DP_CONTROL_MANUAL != endpoint->control_mode)
        {
            result = FULMAR_DP_INVALID;
        }
        else if (!present)
        {
            if (endpoint->destination_count >= FULMAR_DP_MAX_DESTINATIONS)
            {
                result = FULMAR_DP_FULL;
            }
            else
            {
                dp_destination_t *added = &endpoint->destinations[endpoint->destination_count++];
                added->address = *destination;
                added->time_of_last_sm_ns = -1;
            }
        }
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_remove_destination(fulmar_dp_t *dp, int64_t endpoint_id, const fulmar_udp_address_t *destination)
{
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t index = find_send_endpoint(dp, endpoint_id);
    if (index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else if (FULMAR_DP_CONTROL_MANUAL != dp->send_endpoints[index]->control_mode)
    {
        result = FULMAR_DP_INVALID;
    }
    else
    {
        dp_send_endpoint_t *endpoint = dp->send_endpoints[index];
        for (int32_t i = 0; i < endpoint->destination_count; i++)
        {
            if (dp_address_equal(&endpoint->destinations[i].address, destination))
            {
                endpoint->destinations[i] = endpoint->destinations[--endpoint->destination_count];
                result = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_add_receive_endpoint(
    fulmar_dp_t *dp, int64_t endpoint_id, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag,
    const fulmar_udp_address_t *control, int32_t is_manual, int32_t datagram_mac, const char *name)
{
    if (datagram_mac && !dp->config.has_datagram_key)
    {
        return FULMAR_DP_INVALID;
    }
    int32_t result = 0;
    conductor_lock(dp);
    if (find_send_endpoint(dp, endpoint_id) >= 0 || find_receive_endpoint(dp, endpoint_id) >= 0)
    {
        result = FULMAR_DP_EXISTS;
    }
    else if (0 == (result = dp_grow((void ***)&dp->receive_endpoints, &dp->receive_endpoint_capacity,
                                    dp->receive_endpoint_count)))
    {
        dp_receive_endpoint_t *endpoint =
            dp_receive_endpoint_new(endpoint_id, receiver_id, has_group_tag, group_tag, control, is_manual,
                                    datagram_mac ? &dp->datagram_key : NULL, name);
        if (NULL == endpoint)
        {
            result = FULMAR_DP_NO_MEMORY;
        }
        else
        {
            dp->receive_endpoints[dp->receive_endpoint_count++] = endpoint;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    wake(dp);   /* a control address is announced at once */
    return result;
}

int32_t fulmar_dp_set_transport(fulmar_dp_t *dp, int64_t endpoint_id, int32_t transport_index, int32_t fd)
{
    if (transport_index < 0 || transport_index >= FULMAR_DP_MAX_TRANSPORTS)
    {
        return FULMAR_DP_FULL;
    }
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t index = find_receive_endpoint(dp, endpoint_id);
    if (index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else
    {
        dp_receive_endpoint_t *endpoint = dp->receive_endpoints[index];
        const int32_t previous = endpoint->fds[transport_index];
        if (previous >= 0 && previous != fd)
        {
            unwatch_fd(dp, previous);
            for (int32_t i = 0; i < endpoint->image_count; i++)
            {
                dp_image_transport_removed(endpoint->images[i], transport_index);
            }
        }
        if (fd >= 0 && previous != fd && (result = watch_fd(dp, fd)) < 0)
        {
            endpoint->fds[transport_index] = -1;
        }
        else
        {
            endpoint->fds[transport_index] = fd;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_set_streams(fulmar_dp_t *dp, int64_t endpoint_id, const int32_t *stream_ids, int32_t count)
{
    if (count < 0 || count > FULMAR_DP_MAX_STREAMS)
    {
        return FULMAR_DP_FULL;
    }
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t index = find_receive_endpoint(dp, endpoint_id);
    if (index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else
    {
        dp_receive_endpoint_t *endpoint = dp->receive_endpoints[index];
        memcpy(endpoint->stream_ids, stream_ids, sizeof(int32_t) * (size_t)count);
        endpoint->stream_count = count;
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_remove_endpoint(fulmar_dp_t *dp, int64_t endpoint_id)
{
    int32_t result = 0;
    conductor_lock(dp);
    int32_t index;
    if ((index = find_send_endpoint(dp, endpoint_id)) >= 0)
    {
        dp_send_endpoint_t *endpoint = dp->send_endpoints[index];
        if (endpoint->publication_count > 0)
        {
            result = FULMAR_DP_INVALID;
        }
        else
        {
            unwatch_fd(dp, endpoint->fd);
            remove_at((void **)dp->send_endpoints, &dp->send_endpoint_count, index);
            dp_send_endpoint_free(endpoint);
        }
    }
    else if ((index = find_receive_endpoint(dp, endpoint_id)) >= 0)
    {
        dp_receive_endpoint_t *endpoint = dp->receive_endpoints[index];
        if (endpoint->image_count > 0)
        {
            result = FULMAR_DP_INVALID;
        }
        else
        {
            for (int32_t i = 0; i < FULMAR_DP_MAX_TRANSPORTS; i++)
            {
                if (endpoint->fds[i] >= 0)
                {
                    unwatch_fd(dp, endpoint->fds[i]);
                }
            }
            remove_at((void **)dp->receive_endpoints, &dp->receive_endpoint_count, index);
            dp_receive_endpoint_free(endpoint);
        }
    }
    else
    {
        result = FULMAR_DP_UNKNOWN;
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

/* ---------------------------------------------------------------- publications and images */

int32_t fulmar_dp_add_network_publication(fulmar_dp_t *dp, const fulmar_dp_network_publication_t *config)
{
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t endpoint_index = find_send_endpoint(dp, config->endpoint_id);
    if (endpoint_index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else if (id_taken(dp, config->registration_id))
    {
        result = FULMAR_DP_EXISTS;
    }
    else if (0 == (result = dp_grow((void ***)&dp->network_publications, &dp->network_publication_capacity,
                                    dp->network_publication_count)))
    {
        dp_network_publication_t *publication = calloc(1, sizeof(dp_network_publication_t));
        if (NULL == publication)
        {
            result = FULMAR_DP_NO_MEMORY;
        }
        else if ((result = dp_network_publication_init(dp, publication, config, dp->send_endpoints[endpoint_index])) < 0)
        {
            free(publication);
        }
        else
        {
            dp->network_publications[dp->network_publication_count++] = publication;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    wake(dp);   /* its first SETUP goes now */
    return result;
}

int32_t fulmar_dp_add_ipc_publication(
    fulmar_dp_t *dp, int64_t registration_id, char *log, int32_t term_length, int32_t initial_term_id,
    int64_t consumer_position, int64_t term_window_length, int32_t publisher_limit_id, int32_t publisher_position_id)
{
    if (NULL == log || term_length <= 0 || 0 != (term_length & (term_length - 1)) || term_window_length <= 0)
    {
        return FULMAR_DP_INVALID;
    }
    int32_t result = 0;
    conductor_lock(dp);
    if (id_taken(dp, registration_id))
    {
        result = FULMAR_DP_EXISTS;
    }
    else if (0 == (result = dp_grow((void ***)&dp->ipc_publications, &dp->ipc_publication_capacity,
                                    dp->ipc_publication_count)))
    {
        dp_ipc_publication_t *publication = calloc(1, sizeof(dp_ipc_publication_t));
        if (NULL == publication)
        {
            result = FULMAR_DP_NO_MEMORY;
        }
        else
        {
            publication->registration_id = registration_id;
            publication->log = log;
            publication->metadata = log + (int64_t)FULMAR_PARTITION_COUNT * term_length;
            publication->term_length = term_length;
            publication->position_bits_to_shift = dp_position_bits(term_length);
            publication->initial_term_id = initial_term_id;
            publication->publisher_limit_id = publisher_limit_id;
            publication->publisher_position_id = publisher_position_id;
            publication->consumer_position = consumer_position;
            publication->clean_position = consumer_position & ~(int64_t)(FULMAR_FRAME_ALIGNMENT - 1);
            publication->term_window_length = term_window_length;
            /* Recompute the limit only once the window has moved this far:
             * the publishers need not see every small advance. */
            publication->trip_gain = term_window_length / 8;
            publication->relayed_position = ipc_producer_position(publication);
            dp->ipc_publications[dp->ipc_publication_count++] = publication;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    wake(dp);
    return result;
}

int32_t fulmar_dp_add_image(fulmar_dp_t *dp, const fulmar_dp_image_t *config)
{
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t endpoint_index = find_receive_endpoint(dp, config->endpoint_id);
    if (endpoint_index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else if (id_taken(dp, config->correlation_id))
    {
        result = FULMAR_DP_EXISTS;
    }
    else if (0 == (result = dp_grow((void ***)&dp->images, &dp->image_capacity, dp->image_count)))
    {
        dp_image_t *image = calloc(1, sizeof(dp_image_t));
        if (NULL == image)
        {
            result = FULMAR_DP_NO_MEMORY;
        }
        else if ((result = dp_image_init(dp, image, config, dp->receive_endpoints[endpoint_index])) < 0)
        {
            free(image);
        }
        else
        {
            dp->images[dp->image_count++] = image;
        }
    }
    pthread_mutex_unlock(&dp->lock);
    wake(dp);   /* its first status message goes now */
    return result;
}

static dp_readers_t *readers_of(fulmar_dp_t *dp, int64_t id)
{
    int32_t index;
    if ((index = find_network_publication(dp, id)) >= 0)
    {
        return &dp->network_publications[index]->readers;
    }
    if ((index = find_ipc_publication(dp, id)) >= 0)
    {
        return &dp->ipc_publications[index]->readers;
    }
    if ((index = find_image(dp, id)) >= 0)
    {
        return &dp->images[index]->readers;
    }
    return NULL;
}

int32_t fulmar_dp_set_readers(
    fulmar_dp_t *dp, int64_t id, const int32_t *position_ids, int32_t position_count,
    const int32_t *doorbell_ids, int32_t doorbell_count)
{
    if (position_count < 0 || doorbell_count < 0)
    {
        return FULMAR_DP_INVALID;
    }
    /* Allocated outside the lock; what was there is freed once swapped out. */
    dp_readers_t replacement = { NULL, NULL, position_count, doorbell_count, NULL };
    if ((position_count > 0 &&
         (NULL == (replacement.position_ids = malloc(sizeof(int32_t) * (size_t)position_count)) ||
          NULL == (replacement.positions = malloc(sizeof(int64_t) * (size_t)position_count)))) ||
        (doorbell_count > 0 && NULL == (replacement.doorbell_ids = malloc(sizeof(int32_t) * (size_t)doorbell_count))))
    {
        dp_readers_free(&replacement);
        return FULMAR_DP_NO_MEMORY;
    }
    if (position_count > 0)
    {
        memcpy(replacement.position_ids, position_ids, sizeof(int32_t) * (size_t)position_count);
    }
    if (doorbell_count > 0)
    {
        memcpy(replacement.doorbell_ids, doorbell_ids, sizeof(int32_t) * (size_t)doorbell_count);
    }
    int32_t result = 0;
    conductor_lock(dp);
    dp_readers_t *readers = readers_of(dp, id);
    if (NULL == readers)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else
    {
        const dp_readers_t previous = *readers;
        *readers = replacement;
        replacement = previous;
        const int32_t index = find_network_publication(dp, id);
        if (index >= 0)
        {
            dp_network_publication_update_connected(dp->network_publications[index]);   /* spies may connect it */
        }
        const int32_t ipc_index = find_ipc_publication(dp, id);
        if (ipc_index >= 0)
        {
            /* The limit before the conductor marks the publication connected:
             * a publisher that sees it connected may append at once, not find
             * itself back pressured until this thread's next cycle. */
            ipc_update_limit(dp, dp->ipc_publications[ipc_index]);
        }
    }
    pthread_mutex_unlock(&dp->lock);
    dp_readers_free(&replacement);
    wake(dp);
    return result;
}

int32_t fulmar_dp_close_publication(fulmar_dp_t *dp, int64_t registration_id)
{
    int32_t result = 0;
    conductor_lock(dp);
    int32_t index;
    if ((index = find_network_publication(dp, registration_id)) >= 0)
    {
        dp_network_publication_t *publication = dp->network_publications[index];
        if (!publication->is_closed)
        {
            publication->is_closed = 1;
            publication->end_of_stream_position = dp_network_publication_producer_position(publication);
            fa_store_i64(publication->metadata + DP_END_OF_STREAM_POSITION_OFFSET, publication->end_of_stream_position);
        }
    }
    else if ((index = find_ipc_publication(dp, registration_id)) >= 0)
    {
        dp_ipc_publication_t *publication = dp->ipc_publications[index];
        fa_store_i64(publication->metadata + DP_END_OF_STREAM_POSITION_OFFSET, ipc_producer_position(publication));
    }
    else
    {
        result = FULMAR_DP_UNKNOWN;
    }
    pthread_mutex_unlock(&dp->lock);
    wake(dp);
    return result;
}

int32_t fulmar_dp_trigger_setup(fulmar_dp_t *dp, int64_t registration_id)
{
    int32_t result = 0;
    conductor_lock(dp);
    const int32_t index = find_network_publication(dp, registration_id);
    if (index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else
    {
        dp_network_publication_t *publication = dp->network_publications[index];
        fulmar_sender_timing_on_trigger_send_setup(&publication->timing, fulmar_dp_now_ns(),
                                                   dp_network_publication_is_eos_sent(publication));
    }
    pthread_mutex_unlock(&dp->lock);
    wake(dp);
    return result;
}

int32_t fulmar_dp_remove(fulmar_dp_t *dp, int64_t id)
{
    int32_t result = 0;
    conductor_lock(dp);
    int32_t index;
    if ((index = find_network_publication(dp, id)) >= 0)
    {
        dp_network_publication_t *publication = dp->network_publications[index];
        remove_at((void **)dp->network_publications, &dp->network_publication_count, index);
        dp_network_publication_close(publication);
        free(publication);
    }
    else if ((index = find_ipc_publication(dp, id)) >= 0)
    {
        dp_ipc_publication_t *publication = dp->ipc_publications[index];
        remove_at((void **)dp->ipc_publications, &dp->ipc_publication_count, index);
        dp_readers_free(&publication->readers);
        free(publication);
    }
    else if ((index = find_image(dp, id)) >= 0)
    {
        dp_image_t *image = dp->images[index];
        remove_at((void **)dp->images, &dp->image_count, index);
        dp_image_close(image);
        free(image);
    }
    else
    {
        result = FULMAR_DP_UNKNOWN;
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_publication_status(fulmar_dp_t *dp, int64_t registration_id, fulmar_dp_publication_status_t *status)
{
    int32_t result = 0;
    memset(status, 0, sizeof(*status));
    conductor_lock(dp);
    int32_t index;
    if ((index = find_network_publication(dp, registration_id)) >= 0)
    {
        dp_network_publication_t *publication = dp->network_publications[index];
        status->sender_position = publication->sender_position;
        status->producer_position = dp_network_publication_producer_position(publication);
        status->is_connected = publication->is_connected;
        status->is_end_of_stream_sent = dp_network_publication_is_eos_sent(publication);
        status->retransmits_active = publication->retransmit.active_count;
        status->setup_backing_off = fulmar_sender_timing_setup_backing_off(&publication->timing);
    }
    else if ((index = find_ipc_publication(dp, registration_id)) >= 0)
    {
        dp_ipc_publication_t *publication = dp->ipc_publications[index];
        status->sender_position = publication->consumer_position;
        status->producer_position = ipc_producer_position(publication);
        status->is_connected = publication->readers.position_count > 0;
    }
    else
    {
        result = FULMAR_DP_UNKNOWN;
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

int32_t fulmar_dp_image_status(fulmar_dp_t *dp, int64_t correlation_id, fulmar_dp_image_status_t *status)
{
    int32_t result = 0;
    memset(status, 0, sizeof(*status));
    conductor_lock(dp);
    const int32_t index = find_image(dp, correlation_id);
    if (index < 0)
    {
        result = FULMAR_DP_UNKNOWN;
    }
    else
    {
        const fulmar_image_state_t *state = &dp->images[index]->state;
        status->rebuild_position = state->rebuild_position;
        status->hwm_position = state->hwm_position;
        status->time_of_last_packet_ns = state->time_of_last_packet_ns;
        status->is_end_of_stream = fulmar_image_state_is_end_of_stream(state);
    }
    pthread_mutex_unlock(&dp->lock);
    return result;
}

void fulmar_dp_stats(fulmar_dp_t *dp, fulmar_dp_stats_t *stats)
{
    conductor_lock(dp);
    *stats = dp->stats;
    pthread_mutex_unlock(&dp->lock);
}

int32_t fulmar_dp_has_events(fulmar_dp_t *dp)
{
    conductor_lock(dp);
    const int32_t waiting = dp->event_count > 0;
    pthread_mutex_unlock(&dp->lock);
    return waiting;
}

int32_t fulmar_dp_poll_events(fulmar_dp_t *dp, fulmar_dp_event_t *events, int32_t max, int64_t *dropped)
{
    int32_t taken = 0;
    conductor_lock(dp);
    while (taken < max && dp->event_count > 0)
    {
        events[taken++] = dp->events[dp->event_head];
        dp->event_head = (dp->event_head + 1) % DP_EVENT_CAPACITY;
        dp->event_count--;
    }
    if (NULL != dropped)
    {
        *dropped = dp->events_dropped;
    }
    pthread_mutex_unlock(&dp->lock);
    return taken;
}
