// bert_layer: one BERT-base encoder layer, structured and named like HuggingFace's BertLayer
// (modeling_bert.py): attention.self.{query,key,value}, attention.output.{dense,LayerNorm},
// intermediate.dense, output.{dense,LayerNorm}. Post-LayerNorm, GELU in its erf form.
#include "frontends/builder/builder.h"
#include "models/zoo.h"

namespace kiln::models {

namespace {

namespace nn = frontends::nn;

// BertConfig for bert-base-uncased.
struct BertConfig {
  int64_t hiddenSize = 768;
  int64_t numAttentionHeads = 12;
  int64_t intermediateSize = 3072;
  double layerNormEps = 1e-12;
  double hiddenDropoutProb = 0.1;
  double attentionProbsDropoutProb = 0.1;
  int64_t seqLength = 128;
};

class BertSelfAttention : public nn::Module {
 public:
  BertSelfAttention(nn::Scope s, const BertConfig& c)
      : Module(std::move(s), "BertSelfAttention"),
        config(c),
        query(child("query"), c.hiddenSize, c.hiddenSize),
        key(child("key"), c.hiddenSize, c.hiddenSize),
        value(child("value"), c.hiddenSize, c.hiddenSize) {}

  nn::Tensor operator()(nn::Tensor hiddenStates) const {
    auto scope = enter();
    // One statement each: C++ leaves argument evaluation order unspecified.
    nn::Tensor q = query(hiddenStates);
    nn::Tensor k = key(hiddenStates);
    nn::Tensor v = value(hiddenStates);
    return nn::scaledDotProductAttention(q, k, v, config.numAttentionHeads,
                                         config.attentionProbsDropoutProb);
  }

  BertConfig config;
  nn::Linear query, key, value;
};

// BertSelfOutput and BertOutput: dense, dropout, then LayerNorm of the residual sum.
class BertResidualOutput : public nn::Module {
 public:
  BertResidualOutput(nn::Scope s, std::string_view type, int64_t inFeatures, const BertConfig& c)
      : Module(std::move(s), type),
        dense(child("dense"), inFeatures, c.hiddenSize),
        layerNorm(child("LayerNorm"), {c.hiddenSize}, c.layerNormEps),
        dropout(child("dropout"), c.hiddenDropoutProb) {}

  nn::Tensor operator()(nn::Tensor hiddenStates, nn::Tensor inputTensor) const {
    auto scope = enter();
    hiddenStates = dense(hiddenStates);
    hiddenStates = dropout(hiddenStates);
    return layerNorm(hiddenStates + inputTensor);
  }

  nn::Linear dense;
  nn::LayerNorm layerNorm;
  nn::Dropout dropout;
};

class BertAttention : public nn::Module {
 public:
  BertAttention(nn::Scope s, const BertConfig& c)
      : Module(std::move(s), "BertAttention"),
        self(child("self"), c),
        output(child("output"), "BertSelfOutput", c.hiddenSize, c) {}

  nn::Tensor operator()(nn::Tensor hiddenStates) const {
    auto scope = enter();
    return output(self(hiddenStates), hiddenStates);
  }

  BertSelfAttention self;
  BertResidualOutput output;
};

class BertIntermediate : public nn::Module {
 public:
  BertIntermediate(nn::Scope s, const BertConfig& c)
      : Module(std::move(s), "BertIntermediate"),
        dense(child("dense"), c.hiddenSize, c.intermediateSize) {}

  nn::Tensor operator()(nn::Tensor hiddenStates) const {
    auto scope = enter();
    return nn::gelu(dense(hiddenStates), "none");
  }

  nn::Linear dense;
};

class BertLayer : public nn::Module {
 public:
  BertLayer(nn::Scope s, const BertConfig& c)
      : Module(std::move(s), "BertLayer"),
        attention(child("attention"), c),
        intermediate(child("intermediate"), c),
        output(child("output"), "BertOutput", c.intermediateSize, c) {}

  nn::Tensor operator()(nn::Tensor hiddenStates) const {
    auto scope = enter();
    nn::Tensor attentionOutput = attention(hiddenStates);
    nn::Tensor intermediateOutput = intermediate(attentionOutput);
    return output(intermediateOutput, attentionOutput);
  }

  BertAttention attention;
  BertIntermediate intermediate;
  BertResidualOutput output;
};

}  // namespace

Expected<ir::Graph> buildBertLayer(const ModelOptions& options) {
  KILN_TRY(checkOptions("bert_layer", options));
  const BertConfig config;
  nn::Builder b("bert_layer", options.seed);
  BertLayer model(b.root(), config);
  return b.finish(model(b.input("input", {options.batch, config.seqLength, config.hiddenSize})));
}

}  // namespace kiln::models
