/* Message authentication for the members' traffic (issue 48): HMAC-SHA256,
 * truncated to FULMAR_MAC_LENGTH bytes, through OpenSSL's SHA-256 (which uses
 * the CPU's SHA instructions where it has them).
 *
 * A key is prepared once (fulmar_mac_key_init): the SHA-256 states after the
 * key's inner and outer pad blocks are kept, so each MAC costs the message's
 * blocks plus two, not four more.  A prepared key is read-only afterwards and
 * may be used by several threads at once.
 *
 * fulmar_mac2 authenticates the concatenation of two pieces (a message and
 * a trailer written after it, or a datagram's frames in two regions of a log
 * buffer) without copying them together. */

#define FULMAR_MAC_LENGTH 16
/* Room for the two prepared SHA-256 states (OpenSSL's SHA256_CTX is 112 bytes). */
#define FULMAR_MAC_KEY_STATE_LENGTH 256

typedef struct fulmar_mac_key_stct
{
    uint8_t state[FULMAR_MAC_KEY_STATE_LENGTH];
}
fulmar_mac_key_t;

/* Prepares key (any length; longer than a block, it is hashed first, as HMAC
 * says).  Returns 0. */
int32_t fulmar_mac_key_init(fulmar_mac_key_t *key, const uint8_t *secret, int32_t secret_length);

/* out (FULMAR_MAC_LENGTH bytes) = HMAC-SHA256(key, first || second)[:16];
 * second may be NULL with second_length 0. */
void fulmar_mac2(
    const fulmar_mac_key_t *key, const uint8_t *first, int64_t first_length, const uint8_t *second,
    int64_t second_length, uint8_t *out);

/* Whether expected (FULMAR_MAC_LENGTH bytes) is HMAC-SHA256(key, first ||
 * second)[:16]: 1 or 0, compared in constant time. */
int32_t fulmar_mac2_check(
    const fulmar_mac_key_t *key, const uint8_t *first, int64_t first_length, const uint8_t *second,
    int64_t second_length, const uint8_t *expected);
