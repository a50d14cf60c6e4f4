/* A whole counters file in one call; see counters.h. */
#include "_common.h"
#include "counters.h"

/* Agrona's layout (fulmar/counters.py has the whole of it). */
#define METADATA_RECORD_LENGTH 512
#define VALUE_RECORD_LENGTH 128
#define TYPE_ID_OFFSET 4
#define REGISTRATION_ID_OFFSET 8
#define RECORD_UNUSED 0

int32_t fulmar_counters_snapshot(const char *metadata, const char *values, int32_t capacity, int32_t *states,
                                 int32_t *type_ids, int64_t *registration_ids, int64_t *counter_values)
{
    int32_t id = 0;
    for (; id < capacity; id++)
    {
        const char *meta = metadata + (size_t)id * METADATA_RECORD_LENGTH;
        const char *value = values + (size_t)id * VALUE_RECORD_LENGTH;
        int32_t state = fa_load_i32(meta);
        if (state == RECORD_UNUSED)
        {
            break;
        }
        states[id] = state;
        type_ids[id] = fa_load_i32(meta + TYPE_ID_OFFSET);
        registration_ids[id] = fa_load_i64(value + REGISTRATION_ID_OFFSET);
        counter_values[id] = fa_load_i64(value);
    }
    return id;
}
