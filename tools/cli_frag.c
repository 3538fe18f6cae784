/*
 * cli_frag.c -- fragmentation of one device of a snapshot model, in the
 * terms of PyTorch's allocator stats (c10/cuda/CUDACachingAllocator.cpp):
 *
 *   inactive_split   inactive blocks of segments split into more than one
 *                    block (the stat inactive_split_bytes: free memory the
 *                    allocator holds inside segments that are in use, which
 *                    empty_cache cannot return);
 *   free_segments    segments with no active block (one inactive block
 *                    each: empty_cache returns them to the device);
 *   largest_free     the largest inactive block, of every pool and of the
 *                    small (segment_type "small", requests <= 1 MiB) and
 *                    large pools: the largest request the cache can serve
 *                    without a new segment.
 * Active = active_allocated + active_pending_free.  The model is a file's
 * final state or the snapshot of a replayed allocator (cmd_summary.c), so
 * the figures need no trace.
 */
#include <string.h>

#include "cli.h"

void cli_frag_model(const msnap_snap_t *s, int64_t dev, cli_frag_t *f) {
  memset(f, 0, sizeof *f);
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    f->segments++;
    f->reserved += g->total_size;
    bool any_active = false;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      if (b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED)
        f->allocated += b->size;
      if (cli_block_active(b)) {
        f->active += b->size;
        any_active = true;
        continue;
      }
      if (b->state != MSNAP_BLOCK_INACTIVE)
        continue;
      f->inactive += b->size;
      if (g->nblocks > 1) {
        f->inactive_split += b->size;
        f->inactive_split_blocks++;
      }
      if (b->size > f->largest_free)
        f->largest_free = b->size;
      uint64_t *pool = g->is_large ? &f->largest_free_large
                                   : &f->largest_free_small;
      if (b->size > *pool)
        *pool = b->size;
    }
    if (!any_active) {
      f->free_segments++;
      f->free_segments_bytes += g->total_size;
    }
  }
}

void cli_frag_json_fields(cli_json_t *j, const cli_frag_t *f) {
  cj_key(j, "inactive_split_bytes");
  cj_u64(j, f->inactive_split);
  cj_key(j, "inactive_split_blocks");
  cj_u64(j, f->inactive_split_blocks);
  cj_key(j, "largest_free_block_bytes");
  cj_u64(j, f->largest_free);
  cj_key(j, "largest_free_block_by_pool");
  cj_obj(j);
  cj_key(j, "small");
  cj_u64(j, f->largest_free_small);
  cj_key(j, "large");
  cj_u64(j, f->largest_free_large);
  cj_obj_end(j);
  cj_key(j, "free_segments");
  cj_u64(j, f->free_segments);
  cj_key(j, "free_segments_bytes");
  cj_u64(j, f->free_segments_bytes);
  cj_key(j, "inactive_bytes");
  cj_u64(j, f->inactive);
}

void cli_frag_json(cli_json_t *j, const cli_frag_t *f) {
  cj_obj(j);
  cj_key(j, "reserved_bytes");
  cj_u64(j, f->reserved);
  cj_key(j, "allocated_bytes");
  cj_u64(j, f->allocated);
  cj_key(j, "active_bytes");
  cj_u64(j, f->active);
  cli_frag_json_fields(j, f);
  cj_obj_end(j);
}
