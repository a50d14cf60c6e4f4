/* HMAC-SHA256 with prepared keys; see mac.h. */
#define OPENSSL_SUPPRESS_DEPRECATED  /* SHA256_Init and friends: the plain, fast path of OpenSSL 3 */
#include "_common.h"
#include "mac.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#define BLOCK_LENGTH 64
#define INNER_PAD 0x36
#define OUTER_PAD 0x5c

typedef struct
{
    SHA256_CTX inner;  /* after the key ^ ipad block */
    SHA256_CTX outer;  /* after the key ^ opad block */
}
prepared_t;

_Static_assert(sizeof(prepared_t) <= FULMAR_MAC_KEY_STATE_LENGTH, "FULMAR_MAC_KEY_STATE_LENGTH too small");

int32_t fulmar_mac_key_init(fulmar_mac_key_t *key, const uint8_t *secret, int32_t secret_length)
{
    uint8_t block[BLOCK_LENGTH] = { 0 };
    if (secret_length > BLOCK_LENGTH)
    {
        SHA256(secret, (size_t)secret_length, block);
    }
    else if (secret_length > 0)
    {
        memcpy(block, secret, (size_t)secret_length);
    }
    prepared_t *prepared = (prepared_t *)key->state;
    uint8_t pad[BLOCK_LENGTH];
    for (int i = 0; i < BLOCK_LENGTH; i++)
    {
        pad[i] = block[i] ^ INNER_PAD;
    }
    SHA256_Init(&prepared->inner);
    SHA256_Update(&prepared->inner, pad, BLOCK_LENGTH);
    for (int i = 0; i < BLOCK_LENGTH; i++)
    {
        pad[i] = block[i] ^ OUTER_PAD;
    }
    SHA256_Init(&prepared->outer);
    SHA256_Update(&prepared->outer, pad, BLOCK_LENGTH);
    OPENSSL_cleanse(block, sizeof(block));
    OPENSSL_cleanse(pad, sizeof(pad));
    return 0;
}

static void full_mac(
    const fulmar_mac_key_t *key, const uint8_t *first, int64_t first_length, const uint8_t *second,
    int64_t second_length, uint8_t digest[SHA256_DIGEST_LENGTH])
{
    const prepared_t *prepared = (const prepared_t *)key->state;
    SHA256_CTX context = prepared->inner;
    SHA256_Update(&context, first, (size_t)first_length);
    if (second_length > 0)
    {
        SHA256_Update(&context, second, (size_t)second_length);
    }
    uint8_t inner_digest[SHA256_DIGEST_LENGTH];
    SHA256_Final(inner_digest, &context);
    context = prepared->outer;
    SHA256_Update(&context, inner_digest, sizeof(inner_digest));
    SHA256_Final(digest, &context);
}

void fulmar_mac2(
    const fulmar_mac_key_t *key, const uint8_t *first, int64_t first_length, const uint8_t *second,
    int64_t second_length, uint8_t *out)
{
    uint8_t digest[SHA256_DIGEST_LENGTH];
    full_mac(key, first, first_length, second, second_length, digest);
    memcpy(out, digest, FULMAR_MAC_LENGTH);
}

int32_t fulmar_mac2_check(
    const fulmar_mac_key_t *key, const uint8_t *first, int64_t first_length, const uint8_t *second,
    int64_t second_length, const uint8_t *expected)
{
    uint8_t digest[SHA256_DIGEST_LENGTH];
    full_mac(key, first, first_length, second, second_length, digest);
    return 0 == CRYPTO_memcmp(digest, expected, FULMAR_MAC_LENGTH) ? 1 : 0;
}
