/* units.h - expert units of a GGUF MoE model: the seed of the expert store's unit table.
 *
 * An expert unit is (layer, expert id). In GGUF an MoE layer stores its experts as 3-D tensors
 * blk.N.ffn_{gate,up,down}_exps.weight with ne = {ne0, ne1, n_expert} (or a fused
 * ffn_gate_up_exps); expert e's slice of such a tensor is one contiguous slab of
 * row_size(type, ne0) * ne1 bytes at data + e * slab. So a unit is up to three byte ranges of the
 * file, found from the tensor table alone, without reading any weight.
 *
 * hm_units_init derives, for every layer, which expert tensors it has, their slab bytes and the
 * bytes of one unit; everything else (attention, norms, router, embeddings, shared experts) is
 * dense. The expert store (experts/) builds its unit table from this (adding tiers, slots and
 * counters); `hotmoe inspect` prints it.
 *
 * Invariants after a successful init: every expert tensor is 3-D with ne[2] == n_expert of its
 * layer and nbytes == slab * n_expert; a layer with experts has gate+up (or gate_up) and down;
 * expert_bytes + dense_bytes == tensor_bytes. */
#ifndef HM_EXPERTS_UNITS_H
#define HM_EXPERTS_UNITS_H

#include <stdint.h>

#include "../gguf/gguf.h"

/* The parts of a unit, in the order the FFN uses them. GATE_UP is the fused form some
 * converters write (gate and up in one tensor); a layer uses either GATE+UP or GATE_UP. */
typedef enum hm_unit_part {
    HM_UNIT_GATE = 0,
    HM_UNIT_UP = 1,
    HM_UNIT_DOWN = 2,
    HM_UNIT_GATE_UP = 3,
    HM_UNIT_NPART = 4,
} hm_unit_part;

/* Tensor name suffix of a part ("ffn_gate_exps"). */
const char *hm_unit_part_name(hm_unit_part p);

typedef struct hm_units_layer {
    int32_t n_expert;                          /* 0: no expert tensors (a dense layer) */
    const hm_gguf_tensor *part[HM_UNIT_NPART]; /* borrowed from the hm_gguf; NULL if absent */
    uint64_t slab_bytes[HM_UNIT_NPART];        /* one expert's bytes in each part, 0 if absent */
    uint64_t unit_bytes;                       /* sum of slab_bytes */
} hm_units_layer;

typedef struct hm_units {
    const hm_gguf *gguf;    /* borrowed: the model's files (a split model's parts carry their
                             * file: part[p]->file); NULL for hm_units_init_geom */
    int32_t n_files;        /* hm_gguf_n_files, 1 for a geometry-only table */
    int32_t n_layer;        /* <arch>.block_count, else 1 + the highest blk.N seen, else 0 */
    int32_t n_expert;       /* <arch>.expert_count, else from the tensors, else 0 */
    int32_t n_expert_used;  /* <arch>.expert_used_count, else 0 */
    hm_units_layer *layers; /* [n_layer], owned */
    uint64_t n_units;       /* sum over layers of n_expert */
    uint64_t unit_bytes_max; /* the largest unit: the size of a slot that holds any unit */
    uint64_t unit_bytes_min; /* the smallest unit (0 when there are none) */
    uint64_t expert_bytes;  /* all units */
    uint64_t tensor_bytes;  /* all tensors (without alignment padding) */
    uint64_t dense_bytes;   /* tensor_bytes - expert_bytes */
} hm_units;

/* Derive the units of g (borrowed: g must outlive u, which points at its tensors). A model with
 * no expert tensors (dense, or vocab-only) gives n_units 0 and is not an error. Malformed expert
 * tensors (wrong rank, ne[2] disagreeing with expert_count, a missing down or gate part) are
 * HM_ERR_FORMAT naming the tensor. On failure u is left empty (hm_units_free is still safe). */
hm_status hm_units_init(hm_units *u, const hm_gguf *g, hm_err *err);
void hm_units_free(hm_units *u); /* frees layers; NULL-safe, idempotent */

/* A unit table without a file, for planning from a profile and for simulations: n_layer layers of
 * n_expert units of unit_bytes each (part[] NULL, slab_bytes 0, tensor_bytes = expert_bytes).
 * HM_ERR_ARG for non-positive counts or a size that overflows. */
hm_status hm_units_init_geom(hm_units *u, int32_t n_layer, int32_t n_expert, int32_t n_expert_used,
                             uint64_t unit_bytes, hm_err *err);

/* File range of part p of unit (layer, expert): absolute offset and length (0 if absent). */
static inline uint64_t hm_units_offset(const hm_units *u, int32_t layer, int32_t expert,
                                       hm_unit_part p) {
    const hm_units_layer *l = &u->layers[layer];
    return l->part[p] ? l->part[p]->file_offset + (uint64_t)expert * l->slab_bytes[p] : 0;
}

/* File of the model (0 .. n_files-1) that holds part p of layer's units (0 when absent). */
static inline int32_t hm_units_file(const hm_units *u, int32_t layer, hm_unit_part p) {
    const hm_units_layer *l = &u->layers[layer];
    return l->part[p] ? l->part[p]->file : 0;
}

/* The span of file's mapping (a split model maps each file apart) that holds its units' parts:
 * [*lo, *lo + *len) (the expert tensors, and whatever lies between them); *lo NULL and *len 0 when
 * no part is mapped there (a table from hm_units_init_geom, a model without experts). */
void hm_units_span(const hm_units *u, int32_t file, const char **lo, size_t *len);

/* Units that fit in budget bytes when every slot is sized for the largest unit (how the store
 * allocates slot pools), capped at n_units; 0 for a negative budget or no units. */
uint64_t hm_units_fit(const hm_units *u, int64_t budget);

#endif
