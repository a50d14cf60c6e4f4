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

int32_t fulmar_counters_find(const char *metadata, const char *values, int32_t capacity, int32_t type_id,
                             int64_t registration_id, int32_t from_id)
{
    for (int32_t id = from_id < 0 ? 0 : from_id; id < capacity; id++)
    {
        const char *meta = metadata + (size_t)id * FULMAR_COUNTER_METADATA_LENGTH;
        const int32_t state = fa_load_i32(meta);
        if (state == FULMAR_COUNTER_RECORD_UNUSED)
        {
            break;
        }
        if (state != FULMAR_COUNTER_RECORD_ALLOCATED || fa_load_i32(meta + FULMAR_COUNTER_TYPE_ID_OFFSET) != type_id)
        {
            continue;
        }
        if (registration_id == FULMAR_COUNTERS_ANY_REGISTRATION ||
            fa_load_i64(values + (size_t)id * FULMAR_COUNTER_LENGTH + FULMAR_COUNTER_REGISTRATION_ID_OFFSET) ==
                registration_id)
        {
            return id;
        }
    }
    return -1;
}
