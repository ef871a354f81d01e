// `fsdp train --data DIR`: the transformer trains on the token files of `fsdp prepare-data`
// (DIR/train.bin, DIR/val.bin, DIR/meta.json) and reports the validation loss beside the
// corpus's unigram entropy (docs/data.md).
#include <algorithm>
#include <filesystem>

#include "models/model_family.h"
#include "fsdp/data.h"
#include "fsdp/error.h"
#include "runtime/token_file_source.h"
#include "tools/train_command.h"

namespace fsdp::tools {

void attach_token_data(const TrainOptions& o, TrainRun& run) {
  if (o.data_dir.empty()) return;
  namespace fs = std::filesystem;
  runtime::TrainConfig& c = run.config;
  nn::ModelConfig& m = c.model;
  FSDP_USER_CHECK(models::family(m.kind).batch_kind() == models::BatchKind::Tokens,
                  "--data trains a model on token ids, which --model ", m.kind,
                  " is not (use --model transformer or moe-transformer)");
  std::error_code ec;
  FSDP_USER_CHECK(fs::is_directory(o.data_dir, ec), "--data '", o.data_dir,
                  "' is not a directory (make one with `fsdp prepare-data`)");
  const std::string meta_path = o.data_dir + "/meta.json";
  FSDP_USER_CHECK(fs::exists(meta_path, ec), "--data '", o.data_dir,
                  "' has no meta.json: not made by `fsdp prepare-data`");
  const data::CorpusMeta meta = data::read_corpus_meta(meta_path);
  if ((!o.vocab_opt || o.vocab_opt->count() == 0) && !run.model_from_hf) m.vocab = meta.vocab;
  FSDP_USER_CHECK(m.vocab >= meta.vocab, run.model_from_hf ? "the model's vocab_size " : "--vocab ",
                  m.vocab, " is smaller than the tokenizer's ", meta.vocab, " in ", meta_path);
  run.unigram_entropy_nats = meta.unigram_entropy_nats;

  const std::string train = o.data_dir + "/train.bin", val = o.data_dir + "/val.bin";
  // Opening validates each file (one line naming the file and the problem); a sampler of this
  // run's shape checks there is at least one global batch.
  c.batch_source = runtime::token_file_batches(train, m, c.seed);
  c.data_name = train;
  const data::BatchShape shape{c.tokens / m.seq_len, m.seq_len, run.world};
  data::BatchSampler(std::make_shared<const data::TokenFile>(train, m.vocab), shape, c.seed);

  const int every = o.eval_every.value_or(std::max(1, c.steps / 10));
  if (every > 0) {
    const int64_t count = runtime::validation_batch_count(val, m, shape.batch, shape.world_size,
                                                          o.eval_batches);
    FSDP_USER_CHECK(count > 0, val, ": fewer tokens than one validation batch of ",
                    shape.global_sequences(), " x ", m.seq_len, " (+1)");
    c.eval_source = runtime::validation_batches(val, m);
    c.eval_every = every;
    c.eval_batches = count;
  }
}

}  // namespace fsdp::tools
