// Batches from llm.c token files (include/fsdp/data.h): the training sampler and the fixed
// validation batches, as BatchSources (Note [Batch sources]).
#pragma once

#include <memory>
#include <string>

#include "runtime/batch_source.h"

namespace fsdp::runtime {

// Opens (and validates) `path` once; every rank's source shares the mapping. Each micro-batch
// `index` is global batch `index` of data::BatchSampler, seeded with `seed`; a rank's rows are
// whole sequences of model.seq_len. Tokens must be below model.vocab.
BatchSourceFactory token_file_batches(const std::string& path, const nn::ModelConfig& model,
                                      uint64_t seed);
// Validation batch `index` is data::ValidationBatches' batch `index` (the file's first windows,
// in order); validation_batch_count() says how many a shape has.
BatchSourceFactory validation_batches(const std::string& path, const nn::ModelConfig& model);
// How many validation batches of `sequences_per_rank` x seq_len a world of `world_size` ranks
// gets from `path` (up to max_batches); 0 when the file holds less than one.
int64_t validation_batch_count(const std::string& path, const nn::ModelConfig& model,
                               int64_t sequences_per_rank, int world_size, int64_t max_batches);

}  // namespace fsdp::runtime
