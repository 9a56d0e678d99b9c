/* alloc.c - aligned allocation. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

void *hm_malloc_aligned(size_t size) {
    if (size == 0) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, HM_ALIGN, hm_align_up(size, HM_ALIGN)) != 0) return NULL;
    return p;
}

void *hm_calloc_aligned(size_t size) {
    void *p = hm_malloc_aligned(size);
    if (p) memset(p, 0, size);
    return p;
}

void hm_free_aligned(void *p) { free(p); }
