/* Batched UDP datagram I/O: one recvmmsg/sendmmsg system call moves a whole
 * batch of datagrams, so the per-datagram cost is a few hundred nanoseconds
 * of kernel work instead of a Python call and a system call each.
 *
 * Every call passes MSG_DONTWAIT and never blocks: the module's wrappers keep
 * the GIL (see build.py), so a blocking call would stall every thread of the
 * process.  "Would block" is reported as 0 datagrams; other failures as a
 * negated errno.
 *
 * Addresses cross the boundary as fulmar_udp_address_t, not as a sockaddr,
 * so that Python can fill and read them without knowing the C layouts:
 * family is AF_INET or AF_INET6 (the values of Python's socket module), the
 * port is in host byte order, the address bytes in network order (4 used for
 * IPv4, 16 for IPv6). */

/* Datagrams moved by one system call at most (the scratch headers live on
 * the stack); longer batches take several calls inside one function call. */
#define FULMAR_UDP_MAX_BATCH 256

/* Results besides counts (failures are a negated errno). */
#define FULMAR_UDP_REGION_OUT_OF_BOUNDS -1000

typedef struct fulmar_udp_address_stct
{
    int32_t family;
    int32_t port;
    uint32_t scope_id;      /* IPv6 scope (interface index of a link-local address); 0 otherwise */
    uint8_t address[16];
}
fulmar_udp_address_t;

typedef struct fulmar_udp_datagram_stct
{
    int32_t offset;         /* where the datagram starts in the receive buffer (its slot) */
    int32_t length;         /* bytes received into the slot */
    int32_t truncated;      /* 1 when the datagram was longer than its slot and its tail was cut */
    fulmar_udp_address_t source;
}
fulmar_udp_datagram_t;

/* Receive up to max_datagrams datagrams (at most FULMAR_UDP_MAX_BATCH), the
 * i-th into buffer + i * slot_length, describing each in datagrams[i].
 * Returns the count received (0 when none is waiting) or -errno. */
int32_t fulmar_udp_receive_batch(
    int32_t fd, char *buffer, int32_t slot_length, int32_t max_datagrams, fulmar_udp_datagram_t *datagrams);

/* Send count datagrams to one destination: datagram i is the region
 * buffer[regions[2i], regions[2i] + regions[2i+1]), followed by trailers[i *
 * trailer_length, (i + 1) * trailer_length) when trailers is not NULL and
 * trailer_length not 0 (sent as a second piece: the region is not copied).
 * Regions are checked against buffer_length first
 * (FULMAR_UDP_REGION_OUT_OF_BOUNDS, nothing sent).  Returns how many were
 * sent, in order: fewer than count when the socket's send buffer filled (the
 * rest would block), or -errno when the first one failed. */
int32_t fulmar_udp_send_batch(
    int32_t fd,
    const char *buffer,
    int64_t buffer_length,
    const int32_t *regions,
    int32_t count,
    const uint8_t *trailers,
    int32_t trailer_length,
    const fulmar_udp_address_t *destination);

/* The same datagrams to each of destination_count destinations (multi-
 * destination-cast).  results[d] is the number sent to destination d, or
 * -errno when sending to it failed; a failure for one destination does not
 * stop the others, but a full send buffer (shared by all) stops the call.
 * Returns the total sent, or FULMAR_UDP_REGION_OUT_OF_BOUNDS. */
int32_t fulmar_udp_send_batch_to_many(
    int32_t fd,
    const char *buffer,
    int64_t buffer_length,
    const int32_t *regions,
    int32_t count,
    const fulmar_udp_address_t *destinations,
    int32_t destination_count,
    int32_t *results);
