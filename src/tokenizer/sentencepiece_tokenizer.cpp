// A SentencePiece model (tokenizer.model: Llama 2, Mistral, and the ones prepare-data
// trains) behind the Tokenizer interface.
#include "fsdp/error.h"
#include "tokenizer/tokenizer.h"

#ifdef FSDP_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>

#include <algorithm>
#endif

namespace fsdp::tokenizer {

#ifndef FSDP_WITH_SENTENCEPIECE

bool reads_sentencepiece() {
  return false;
}

std::unique_ptr<Tokenizer> tokenizer_from_sentencepiece(const std::string&,
                                                        const std::string& name) {
  FSDP_USER_FAIL(name,
                 ": this build does not read SentencePiece models (SentencePiece was not "
                 "found when it was configured)");
}

#else

namespace {

std::string one_line(const sentencepiece::util::Status& s) {
  std::string msg = s.ToString();
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  return msg;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model, const std::string& name) : name_(name) {
    const auto status = sp_.LoadFromSerializedProto(model);
    if (!status.ok()) FSDP_USER_FAIL(name, ": not a SentencePiece model: ", one_line(status));
    const int64_t n = sp_.GetPieceSize();
    if (n < 1 || n > kMaxTokenizerVocab)
      FSDP_USER_FAIL(name, ": ", n, " pieces; this reader takes 1..", kMaxTokenizerVocab);
  }
  std::string description() const override { return "SentencePiece"; }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }

  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) FSDP_USER_FAIL(name_, ": cannot encode the text: ", one_line(status));
    std::vector<uint32_t> out;
    out.reserve(ids.size() + 1);
    // As Hugging Face's Llama 2 and Mistral tokenizers do: <s> first, no </s>.
    if (add_special_tokens && sp_.bos_id() >= 0) out.push_back(static_cast<uint32_t>(sp_.bos_id()));
    for (int id : ids) out.push_back(static_cast<uint32_t>(id));
    return out;
  }

  std::string decode(std::span<const uint32_t> ids, bool) const override {
    std::vector<int> in;
    in.reserve(ids.size());
    for (uint32_t id : ids) {
      FSDP_USER_CHECK(id < static_cast<uint32_t>(sp_.GetPieceSize()), name_, ": id ", id,
                      " is outside the vocabulary of ", sp_.GetPieceSize(), " pieces");
      in.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = sp_.Decode(in, &text);
    if (!status.ok()) FSDP_USER_FAIL(name_, ": cannot decode: ", one_line(status));
    return text;
  }

  std::optional<uint32_t> bos_id() const override { return id_or_none(sp_.bos_id()); }
  std::optional<uint32_t> eos_id() const override { return id_or_none(sp_.eos_id()); }
  std::optional<uint32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    // PieceToId answers <unk>'s id for what is no piece; only <unk> itself is <unk>.
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id_or_none(id);
  }

 private:
  static std::optional<uint32_t> id_or_none(int id) {
    return id >= 0 ? std::optional<uint32_t>(static_cast<uint32_t>(id)) : std::nullopt;
  }
  sentencepiece::SentencePieceProcessor sp_;
  std::string name_;
};

}  // namespace

bool reads_sentencepiece() {
  return true;
}

std::unique_ptr<Tokenizer> tokenizer_from_sentencepiece(const std::string& model,
                                                        const std::string& name) {
  return std::make_unique<SentencePieceTokenizer>(model, name);
}

#endif  // FSDP_WITH_SENTENCEPIECE

}  // namespace fsdp::tokenizer
