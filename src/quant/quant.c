/* quant.c - the type-traits table: built once (pthread_once) from each family's register
 * function, then read-only. Also type names, row sizes and ISA availability. */
#include "quant.h"

#include <pthread.h>
#include <strings.h>

#include "quant_impl.h"

static hm_type_traits table[HM_TYPE_COUNT];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

/* Types we can name and size but do not compute (so inspect can describe any file). */
static void register_known_sizes(hm_type_traits *t) {
    static const struct { int id; const char *name; int64_t blck; size_t size; } known[] = {
        {HM_TYPE_Q4_1, "q4_1", 32, 20}, {HM_TYPE_Q5_1, "q5_1", 32, 24}, {HM_TYPE_Q8_1, "q8_1", 32, 36},
        {HM_TYPE_Q2_K, "q2_K", 256, 84}, {HM_TYPE_Q3_K, "q3_K", 256, 110},
        {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74}, {18, "iq3_xxs", 256, 98},
        {19, "iq1_s", 256, 50}, {20, "iq4_nl", 32, 18}, {21, "iq3_s", 256, 110},
        {22, "iq2_s", 256, 82}, {24, "i8", 1, 1}, {25, "i16", 1, 2}, {26, "i32", 1, 4},
        {27, "i64", 1, 8}, {28, "f64", 1, 8}, {29, "iq1_m", 256, 56},
        {34, "tq1_0", 256, 54}, {35, "tq2_0", 256, 66},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        hm_type_traits *e = &t[known[i].id];
        e->name = known[i].name;
        e->blck_size = known[i].blck;
        e->type_size = known[i].size;
        e->supported = false;
    }
}

static void build_table(void) {
    register_known_sizes(table);
    hm_quant_register_float(table);
    hm_quant_register_q8_0(table);
    hm_quant_register_k(table);
    hm_quant_register_lowbit(table);
    hm_quant_register_iq(table);
    for (int i = 0; i < HM_TYPE_COUNT; i++) {
        hm_type_traits *e = &table[i];
        if (!e->vec_dot)
            for (int isa = HM_ISA_COUNT - 1; isa >= 0 && !e->vec_dot; isa--) e->vec_dot = e->vec_dot_isa[isa];
        if (!e->to_float) e->to_float = e->to_float_ref;
        if (!e->from_float) e->from_float = e->from_float_ref;
        e->supported = e->name && e->to_float_ref && e->vec_dot_isa[HM_ISA_SCALAR];
    }
}

const hm_type_traits *hm_type_get(int t) {
    if (t < 0 || t >= HM_TYPE_COUNT) return NULL;
    pthread_once(&table_once, build_table);
    return &table[t];
}

const char *hm_type_name(int t) {
    const hm_type_traits *e = hm_type_get(t);
    return e && e->name ? e->name : "unknown";
}

int hm_type_from_name(const char *name) {
    for (int i = 0; i < HM_TYPE_COUNT; i++) {
        const hm_type_traits *e = hm_type_get(i);
        if (e->name && strcasecmp(e->name, name) == 0) return i;
    }
    return -1;
}

size_t hm_row_size(int t, int64_t ne0) {
    const hm_type_traits *e = hm_type_get(t);
    if (!e || !e->name || e->blck_size <= 0 || ne0 < 0 || ne0 % e->blck_size) return 0;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)(ne0 / e->blck_size), e->type_size, &bytes)) return 0;
    return bytes;
}

bool hm_isa_available(hm_isa isa) {
    switch (isa) {
    case HM_ISA_SCALAR: return true;
#ifdef __AVX2__
    case HM_ISA_AVX2: return true;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    case HM_ISA_AVX512: return true;
#endif
    default: return false;
    }
}
