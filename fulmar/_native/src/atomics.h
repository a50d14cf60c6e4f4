/* Atomic access to 32- and 64-bit words inside shared (mmap'd) memory.
 * Every function takes a base pointer and a byte offset; the Python layer
 * checks bounds and natural alignment before calling. */
int32_t fulmar_get_int32_volatile(char *base, int64_t offset);
int64_t fulmar_get_int64_volatile(char *base, int64_t offset);
void fulmar_put_int32_ordered(char *base, int64_t offset, int32_t value);
void fulmar_put_int64_ordered(char *base, int64_t offset, int64_t value);
bool fulmar_compare_and_set_int32(char *base, int64_t offset, int32_t expected, int32_t desired);
bool fulmar_compare_and_set_int64(char *base, int64_t offset, int64_t expected, int64_t desired);
int32_t fulmar_get_and_add_int32(char *base, int64_t offset, int32_t delta);
int64_t fulmar_get_and_add_int64(char *base, int64_t offset, int64_t delta);
void fulmar_set_memory(char *base, int64_t offset, int64_t length, int32_t value);
