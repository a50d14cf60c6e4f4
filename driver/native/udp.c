/* Batched UDP I/O over recvmmsg/sendmmsg; see udp.h for the contract. */
/* recvmmsg and sendmmsg are GNU extensions: ask for them before any header. */
#define _GNU_SOURCE
#include "_common.h"
#include "udp.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

static socklen_t to_sockaddr(const fulmar_udp_address_t *address, struct sockaddr_storage *storage)
{
    memset(storage, 0, sizeof(*storage));
    if (AF_INET6 == address->family)
    {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)storage;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)address->port);
        in6->sin6_scope_id = address->scope_id;
        memcpy(&in6->sin6_addr, address->address, sizeof(in6->sin6_addr));
        return sizeof(*in6);
    }

    /* Any other family is passed through as given, so that the kernel
     * rejects it with its own errno rather than this code inventing one. */
    struct sockaddr_in *in4 = (struct sockaddr_in *)storage;
    in4->sin_family = (sa_family_t)address->family;
    in4->sin_port = htons((uint16_t)address->port);
    memcpy(&in4->sin_addr, address->address, sizeof(in4->sin_addr));
    return sizeof(*in4);
}

static void from_sockaddr(const struct sockaddr_storage *storage, socklen_t length, fulmar_udp_address_t *address)
{
    memset(address, 0, sizeof(*address));
    if (AF_INET == storage->ss_family && length >= (socklen_t)sizeof(struct sockaddr_in))
    {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)storage;
        address->family = AF_INET;
        address->port = ntohs(in4->sin_port);
        memcpy(address->address, &in4->sin_addr, sizeof(in4->sin_addr));
    }
    else if (AF_INET6 == storage->ss_family && length >= (socklen_t)sizeof(struct sockaddr_in6))
    {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)storage;
        address->family = AF_INET6;
        address->port = ntohs(in6->sin6_port);
        address->scope_id = in6->sin6_scope_id;
        memcpy(address->address, &in6->sin6_addr, sizeof(in6->sin6_addr));
    }
    /* else family stays 0: a source the caller cannot reply to. */
}

int32_t fulmar_udp_receive_batch(
    int32_t fd, char *buffer, int32_t slot_length, int32_t max_datagrams, fulmar_udp_datagram_t *datagrams)
{
    struct mmsghdr messages[FULMAR_UDP_MAX_BATCH];
    struct iovec iovecs[FULMAR_UDP_MAX_BATCH];
    struct sockaddr_storage sources[FULMAR_UDP_MAX_BATCH];

    if (max_datagrams <= 0 || slot_length <= 0)
    {
        return -EINVAL;
    }
    if (max_datagrams > FULMAR_UDP_MAX_BATCH)
    {
        max_datagrams = FULMAR_UDP_MAX_BATCH;
    }

    for (int32_t i = 0; i < max_datagrams; i++)
    {
        iovecs[i].iov_base = buffer + (size_t)i * (size_t)slot_length;
        iovecs[i].iov_len = (size_t)slot_length;
        memset(&messages[i], 0, sizeof(messages[i]));
        messages[i].msg_hdr.msg_name = &sources[i];
        messages[i].msg_hdr.msg_namelen = sizeof(sources[i]);
        messages[i].msg_hdr.msg_iov = &iovecs[i];
        messages[i].msg_hdr.msg_iovlen = 1;
    }

    int received;
    do
    {
        received = recvmmsg(fd, messages, (unsigned int)max_datagrams, MSG_DONTWAIT, NULL);
    }
    while (received < 0 && EINTR == errno);

    if (received < 0)
    {
        return (EAGAIN == errno || EWOULDBLOCK == errno) ? 0 : -errno;
    }

    for (int i = 0; i < received; i++)
    {
        fulmar_udp_datagram_t *datagram = &datagrams[i];
        datagram->offset = i * slot_length;
        datagram->length = (int32_t)messages[i].msg_len;
        datagram->truncated = (messages[i].msg_hdr.msg_flags & MSG_TRUNC) ? 1 : 0;
        from_sockaddr(&sources[i], messages[i].msg_hdr.msg_namelen, &datagram->source);
    }

    return received;
}

static bool regions_in_bounds(int64_t buffer_length, const int32_t *regions, int32_t count)
{
    for (int32_t i = 0; i < count; i++)
    {
        const int64_t offset = regions[2 * i];
        const int64_t length = regions[2 * i + 1];
        if (offset < 0 || length < 0 || offset + length > buffer_length)
        {
            return false;
        }
    }
    return true;
}

/* Sends the regions to one address in chunks of FULMAR_UDP_MAX_BATCH.
 * Returns how many went; *error is 0 when all did, EAGAIN when the send
 * buffer filled, else the errno that stopped it. */
static int32_t send_regions(
    int32_t fd,
    const char *buffer,
    const int32_t *regions,
    int32_t count,
    const uint8_t *trailers,
    int32_t trailer_length,
    struct sockaddr_storage *destination,
    socklen_t destination_length,
    int *error)
{
    struct mmsghdr messages[FULMAR_UDP_MAX_BATCH];
    struct iovec iovecs[2 * FULMAR_UDP_MAX_BATCH];
    int32_t sent = 0;

    *error = 0;
    while (sent < count)
    {
        const int32_t chunk = count - sent < FULMAR_UDP_MAX_BATCH ? count - sent : FULMAR_UDP_MAX_BATCH;
        for (int32_t j = 0; j < chunk; j++)
        {
            const int32_t region = sent + j;
            struct iovec *iovec = &iovecs[2 * j];
            iovec[0].iov_base = (void *)(buffer + regions[2 * region]);
            iovec[0].iov_len = (size_t)regions[2 * region + 1];
            memset(&messages[j], 0, sizeof(messages[j]));
            messages[j].msg_hdr.msg_name = destination;
            messages[j].msg_hdr.msg_namelen = destination_length;
            messages[j].msg_hdr.msg_iov = iovec;
            messages[j].msg_hdr.msg_iovlen = 1;
            if (NULL != trailers)
            {
                /* The trailer is a second piece of the same datagram: the
                 * region itself (a log buffer's frames) is not copied. */
                iovec[1].iov_base = (void *)(trailers + (size_t)region * (size_t)trailer_length);
                iovec[1].iov_len = (size_t)trailer_length;
                messages[j].msg_hdr.msg_iovlen = 2;
            }
        }

        const int result = sendmmsg(fd, messages, (unsigned int)chunk, MSG_DONTWAIT);
        if (result < 0)
        {
            if (EINTR == errno)
            {
                continue;
            }
            *error = (EWOULDBLOCK == errno) ? EAGAIN : errno;
            break;
        }
        /* A short count means message `result` failed; the next round sends
         * from it and learns the errno. */
        sent += result;
    }

    return sent;
}

int32_t fulmar_udp_send_batch(
    int32_t fd,
    const char *buffer,
    int64_t buffer_length,
    const int32_t *regions,
    int32_t count,
    const uint8_t *trailers,
    int32_t trailer_length,
    const fulmar_udp_address_t *destination)
{
    struct sockaddr_storage storage;
    socklen_t storage_length = 0;
    int error;

    if (count < 0 || trailer_length < 0)
    {
        return -EINVAL;
    }
    if (0 == trailer_length)
    {
        trailers = NULL;  /* an empty trailer is none: one piece per datagram */
    }
    if (!regions_in_bounds(buffer_length, regions, count))
    {
        return FULMAR_UDP_REGION_OUT_OF_BOUNDS;
    }
    if (NULL != destination)  /* NULL: a connected socket's peer */
    {
        storage_length = to_sockaddr(destination, &storage);
    }

    const int32_t sent = send_regions(
        fd, buffer, regions, count, trailers, trailer_length, NULL != destination ? &storage : NULL, storage_length,
        &error);
    /* Datagrams that went count even when a later one failed: the caller
     * retries the rest and then sees the error. */
    if (0 == sent && 0 != error && EAGAIN != error)
    {
        return -error;
    }
    return sent;
}

int32_t fulmar_udp_send_batch_to_many(
    int32_t fd,
    const char *buffer,
    int64_t buffer_length,
    const int32_t *regions,
    int32_t count,
    const fulmar_udp_address_t *destinations,
    int32_t destination_count,
    int32_t *results)
{
    struct sockaddr_storage storage;
    int32_t total = 0;
    int error;

    if (count < 0 || destination_count < 0)
    {
        return -EINVAL;
    }
    if (!regions_in_bounds(buffer_length, regions, count))
    {
        return FULMAR_UDP_REGION_OUT_OF_BOUNDS;
    }
    for (int32_t d = 0; d < destination_count; d++)
    {
        results[d] = 0;
    }

    for (int32_t d = 0; d < destination_count; d++)
    {
        const socklen_t storage_length = to_sockaddr(&destinations[d], &storage);
        const int32_t sent = send_regions(fd, buffer, regions, count, NULL, 0, &storage, storage_length, &error);
        total += sent;
        /* An unreachable destination must not cost the others their data. */
        results[d] = (0 != error && EAGAIN != error) ? -error : sent;
        if (EAGAIN == error)
        {
            /* One send buffer serves every destination: the rest would block too. */
            break;
        }
    }

    return total;
}
