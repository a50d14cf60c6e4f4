/* The members' consensus trailer; see member_auth.h. */
#define _GNU_SOURCE
#include "_common.h"
#include "mac.h"
#include "member_auth.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

#define MAGIC "FMC1"
#define SENDER_OFFSET 4
#define RECEIVER_OFFSET 8
#define KEY_ID_OFFSET 12
#define BOOT_ID_OFFSET 16
#define COUNTER_OFFSET 24
#define TIMESTAMP_OFFSET 32
#define SIGNED_FIELDS_LENGTH 40
/* The shortest body a trailer may follow: an SBE message header. */
#define SBE_HEADER_LENGTH 8

_Static_assert(SIGNED_FIELDS_LENGTH + FULMAR_MAC_LENGTH == FULMAR_MEMBER_AUTH_TRAILER_LENGTH, "trailer layout");
_Static_assert(FULMAR_MEMBER_AUTH_REPLAY_WINDOW == 64, "the replay window is one 64-bit bitmap");

typedef struct
{
    int32_t valid;
    uint64_t boot_id;
    uint64_t highest;   /* the highest counter taken of this boot */
    uint64_t bitmap;    /* bit i: counter highest - i taken (bit 0 is highest itself) */
    uint64_t used;      /* when it was last taken from (the auth's use clock): the oldest goes first */
} boot_t;

typedef struct
{
    boot_t boots[FULMAR_MEMBER_AUTH_BOOTS_KEPT];
} sender_t;

struct fulmar_member_auth_stct
{
    fulmar_mac_key_t key;
    int32_t member_id;
    int32_t member_count;
    int32_t member_ids[FULMAR_MEMBER_AUTH_MAX_MEMBERS];
    uint64_t boot_id;
    uint64_t counter;              /* atomic: every signer of the process takes the next */
    int64_t window_ms;
    pthread_mutex_t lock;          /* the replay state below */
    uint64_t use_clock;
    int32_t checking_since_set;
    int64_t checking_since_ms;     /* the now of the first message this context took */
    sender_t senders[FULMAR_MEMBER_AUTH_MAX_MEMBERS];  /* by the sender's index in member_ids */
};

fulmar_member_auth_t *fulmar_member_auth_new(
    const uint8_t *key, int32_t key_length, int32_t member_id, const int32_t *member_ids, int32_t member_count,
    const uint64_t *boot_id, uint64_t counter, int64_t window_ms)
{
    if (NULL == key || key_length <= 0 || member_count < 0 || member_count > FULMAR_MEMBER_AUTH_MAX_MEMBERS ||
        (member_count > 0 && NULL == member_ids) || window_ms < 0)
    {
        errno = EINVAL;
        return NULL;
    }
    fulmar_member_auth_t *auth = calloc(1, sizeof(*auth));
    if (NULL == auth)
    {
        return NULL;
    }
    if (NULL != boot_id)
    {
        auth->boot_id = *boot_id;
    }
    else if (getrandom(&auth->boot_id, sizeof(auth->boot_id), 0) != (ssize_t)sizeof(auth->boot_id))
    {
        const int error = errno;
        free(auth);
        errno = error;
        return NULL;
    }
    fulmar_mac_key_init(&auth->key, key, key_length);
    auth->member_id = member_id;
    auth->member_count = member_count;
    if (member_count > 0)
    {
        memcpy(auth->member_ids, member_ids, sizeof(int32_t) * (size_t)member_count);
    }
    auth->counter = counter;
    auth->window_ms = window_ms;
    pthread_mutex_init(&auth->lock, NULL);
    return auth;
}

void fulmar_member_auth_free(fulmar_member_auth_t *auth)
{
    if (NULL == auth)
    {
        return;
    }
    pthread_mutex_destroy(&auth->lock);
    memset(&auth->key, 0, sizeof(auth->key));
    free(auth);
}

uint64_t fulmar_member_auth_boot_id(const fulmar_member_auth_t *auth)
{
    return auth->boot_id;
}

uint64_t fulmar_member_auth_counter(const fulmar_member_auth_t *auth)
{
    return __atomic_load_n(&auth->counter, __ATOMIC_SEQ_CST);
}

int64_t fulmar_member_auth_window_ms(const fulmar_member_auth_t *auth)
{
    return auth->window_ms;
}

int64_t fulmar_member_auth_now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000LL + now.tv_nsec / 1000000LL;
}

int32_t fulmar_member_auth_sign(
    fulmar_member_auth_t *auth, char *buffer, int32_t body_length, int32_t receiver, int64_t now_ms)
{
    char *trailer = buffer + body_length;
    const uint64_t counter = __atomic_add_fetch(&auth->counter, 1, __ATOMIC_SEQ_CST);
    const uint32_t key_id = 0;
    memcpy(trailer, MAGIC, 4);
    memcpy(trailer + SENDER_OFFSET, &auth->member_id, 4);
    memcpy(trailer + RECEIVER_OFFSET, &receiver, 4);
    memcpy(trailer + KEY_ID_OFFSET, &key_id, 4);
    memcpy(trailer + BOOT_ID_OFFSET, &auth->boot_id, 8);
    memcpy(trailer + COUNTER_OFFSET, &counter, 8);
    memcpy(trailer + TIMESTAMP_OFFSET, &now_ms, 8);
    fulmar_mac2(&auth->key, (const uint8_t *)buffer, body_length + SIGNED_FIELDS_LENGTH, NULL, 0,
        (uint8_t *)trailer + SIGNED_FIELDS_LENGTH);
    return body_length + FULMAR_MEMBER_AUTH_TRAILER_LENGTH;
}

static int32_t member_index(const fulmar_member_auth_t *auth, int32_t member_id)
{
    for (int32_t i = 0; i < auth->member_count; i++)
    {
        if (auth->member_ids[i] == member_id)
        {
            return i;
        }
    }
    return -1;
}

/* With the lock held: whether counter of boot_id may be taken from sender,
 * and where (*slot: the boot's, or the one a new boot replaces; *is_new). */
static int32_t may_take(sender_t *sender, uint64_t boot_id, uint64_t counter, boot_t **slot, int32_t *is_new)
{
    boot_t *oldest = NULL;
    for (int32_t i = 0; i < FULMAR_MEMBER_AUTH_BOOTS_KEPT; i++)
    {
        boot_t *boot = &sender->boots[i];
        if (boot->valid && boot->boot_id == boot_id)
        {
            *slot = boot;
            *is_new = 0;
            if (counter > boot->highest)
            {
                return 1;
            }
            const uint64_t behind = boot->highest - counter;
            if (behind >= FULMAR_MEMBER_AUTH_REPLAY_WINDOW)
            {
                return 0;  /* older than the window: it cannot be told from a replay */
            }
            return 0 == (boot->bitmap & (1ULL << behind));
        }
        /* Where a new boot goes: a free slot, else the one least recently taken from. */
        if (!boot->valid)
        {
            if (NULL == oldest || oldest->valid)
            {
                oldest = boot;
            }
        }
        else if (NULL == oldest || (oldest->valid && boot->used < oldest->used))
        {
            oldest = boot;
        }
    }
    /* A boot not seen (or forgotten): its counters start at 1. */
    *slot = oldest;
    *is_new = 1;
    return counter > 0;
}

static void take(fulmar_member_auth_t *auth, boot_t *boot, int32_t is_new, uint64_t boot_id, uint64_t counter)
{
    if (is_new)
    {
        boot->valid = 1;
        boot->boot_id = boot_id;
        boot->highest = counter;
        boot->bitmap = 1;
    }
    else if (counter > boot->highest)
    {
        const uint64_t ahead = counter - boot->highest;
        boot->bitmap = ahead >= FULMAR_MEMBER_AUTH_REPLAY_WINDOW ? 1 : (boot->bitmap << ahead) | 1;
        boot->highest = counter;
    }
    else
    {
        boot->bitmap |= 1ULL << (boot->highest - counter);
    }
    boot->used = ++auth->use_clock;
}

int32_t fulmar_member_auth_check(
    fulmar_member_auth_t *auth, const char *message, int32_t length, int64_t now_ms, int32_t member_id_offset,
    int32_t field, int32_t *sender)
{
    const int32_t body_length = length - FULMAR_MEMBER_AUTH_TRAILER_LENGTH;
    if (body_length < SBE_HEADER_LENGTH)
    {
        return FULMAR_MEMBER_AUTH_NO_TRAILER;
    }
    const char *trailer = message + body_length;
    if (0 != memcmp(trailer, MAGIC, 4))
    {
        return FULMAR_MEMBER_AUTH_NO_TRAILER;
    }
    if (!fulmar_mac2_check(&auth->key, (const uint8_t *)message, body_length + SIGNED_FIELDS_LENGTH, NULL, 0,
            (const uint8_t *)trailer + SIGNED_FIELDS_LENGTH))
    {
        return FULMAR_MEMBER_AUTH_WRONG_MAC;
    }
    int32_t from, to;
    uint64_t boot_id, counter;
    int64_t timestamp_ms;
    memcpy(&from, trailer + SENDER_OFFSET, 4);
    memcpy(&to, trailer + RECEIVER_OFFSET, 4);
    memcpy(&boot_id, trailer + BOOT_ID_OFFSET, 8);
    memcpy(&counter, trailer + COUNTER_OFFSET, 8);
    memcpy(&timestamp_ms, trailer + TIMESTAMP_OFFSET, 8);
    if (to != auth->member_id)
    {
        return FULMAR_MEMBER_AUTH_OTHER_RECEIVER;
    }
    const int32_t index = member_index(auth, from);
    if (index < 0 || from == auth->member_id)
    {
        return FULMAR_MEMBER_AUTH_NOT_A_MEMBER;
    }
    if (FULMAR_MEMBER_AUTH_FIELD_NONE != field)
    {
        if (member_id_offset < 0 || member_id_offset + 4 > body_length)
        {
            return FULMAR_MEMBER_AUTH_TOO_SHORT_FOR_MEMBER_ID;
        }
        int32_t named;
        memcpy(&named, message + member_id_offset, 4);
        if (named != (FULMAR_MEMBER_AUTH_FIELD_NAMES_SENDER == field ? from : auth->member_id))
        {
            return FULMAR_MEMBER_AUTH_MEMBER_ID_MISMATCH;
        }
    }
    /* (In 128 bits: a timestamp that is anything at all cannot overflow.) */
    if ((__int128)timestamp_ms - (__int128)now_ms > auth->window_ms)
    {
        return FULMAR_MEMBER_AUTH_OUTSIDE_WINDOW;  /* from the future: clocks apart */
    }
    pthread_mutex_lock(&auth->lock);
    const int64_t checking_since_ms = auth->checking_since_set ? auth->checking_since_ms : now_ms;
    boot_t *boot;
    int32_t is_new;
    int32_t taken = may_take(&auth->senders[index], boot_id, counter, &boot, &is_new);
    /* A boot this receiver knows is guarded by its counters alone: a message
     * read late (this member or its sender was paused, its socket buffer held
     * it) is still that boot's next, and refusing it would refuse a member.
     * A boot it does not know (it restarted and forgot, or the sender is new)
     * has no counters to go by: its message must have been sent no earlier
     * than the window before this receiver began checking, so that one
     * recorded before a restart of this member and sent again is refused. */
    const int32_t too_old = is_new && (__int128)checking_since_ms - (__int128)timestamp_ms > auth->window_ms;
    if (taken && !too_old)
    {
        take(auth, boot, is_new, boot_id, counter);
        if (!auth->checking_since_set)
        {
            auth->checking_since_set = 1;  /* the first message taken: a refused check changes nothing */
            auth->checking_since_ms = now_ms;
        }
    }
    pthread_mutex_unlock(&auth->lock);
    if (too_old)
    {
        return FULMAR_MEMBER_AUTH_BEFORE_START;
    }
    if (!taken)
    {
        return FULMAR_MEMBER_AUTH_REPLAYED;
    }
    if (NULL != sender)
    {
        *sender = from;
    }
    return body_length;
}
