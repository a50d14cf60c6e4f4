/* A whole counters file in one call; see counters.h. */
#include "_common.h"
#include "counters.h"

int32_t fulmar_counters_snapshot(const char *metadata, const char *values, int32_t capacity, int32_t *states,
                                 int32_t *type_ids, int64_t *registration_ids, int64_t *counter_values)
{
    int32_t id = 0;
    for (; id < capacity; id++)
    {
        const char *meta = metadata + (size_t)id * FULMAR_COUNTER_METADATA_LENGTH;
        const char *value = values + (size_t)id * FULMAR_COUNTER_LENGTH;
        int32_t state = fa_load_i32(meta);
        if (state == FULMAR_COUNTER_RECORD_UNUSED)
        {
            break;
        }
        states[id] = state;
        type_ids[id] = fa_load_i32(meta + FULMAR_COUNTER_TYPE_ID_OFFSET);
        registration_ids[id] = fa_load_i64(value + FULMAR_COUNTER_REGISTRATION_ID_OFFSET);
        counter_values[id] = fa_load_i64(value);
    }
    return id;
}
