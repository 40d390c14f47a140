"""PyTorch twins of kiln's zoo models (models/*.cpp), layer for layer and name for name, so
that a state_dict moves between the two unchanged."""
import math

import torch
from torch import nn
import torch.nn.functional as F


class MnistCnn(nn.Module):
    """The `Net` of pytorch/examples mnist/main.py (kiln: models/mnist_cnn.cpp)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads

        def split(t):  # [B, S, H] -> [B, heads, S, d]
            return t.view(b, s, self.heads, d).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        probs = self.dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)
        return ctx


class BertResidualOutput(nn.Module):
    def __init__(self, inputs, hidden, eps, dropout):
        super().__init__()
        self.dense = nn.Linear(inputs, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, hidden, heads, eps, dropout):
        super().__init__()
        self.self = BertSelfAttention(hidden, heads, dropout)
        self.output = BertResidualOutput(hidden, hidden, eps, dropout)

    def forward(self, x):
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)

    def forward(self, x):
        return F.gelu(self.dense(x))  # The erf form, as HuggingFace's "gelu".


class BertLayer(nn.Module):
    """One bert-base-uncased encoder layer, named like HuggingFace's BertLayer
    (kiln: models/bert.cpp)."""

    def __init__(self, hidden=768, heads=12, intermediate=3072, eps=1e-12, dropout=0.1):
        super().__init__()
        self.attention = BertAttention(hidden, heads, eps, dropout)
        self.intermediate = BertIntermediate(hidden, intermediate)
        self.output = BertResidualOutput(intermediate, hidden, eps, dropout)

    def forward(self, x):
        attention_output = self.attention(x)
        return self.output(self.intermediate(attention_output), attention_output)


class Gpt2Block(nn.Module):
    """A GPT-2-style decoder on integer token ids, as HuggingFace's GPT2Model lays it out: token
    and position embeddings, one pre-LayerNorm block (causal self-attention through
    F.scaled_dot_product_attention, an MLP with the tanh GELU), the final LayerNorm and the
    language-model head tied to the token embedding. GPT-2 small's width (768, 12 heads) and a
    32,000-token vocabulary; input [batch, seq] int64, output [batch, seq, vocab] logits."""

    def __init__(self, vocab=32000, positions=1024, hidden=768, heads=12, eps=1e-5):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)
        self.ln_f = nn.LayerNorm(hidden, eps=eps)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, ids):
        b, s = ids.shape
        h = self.wte.weight.shape[1]
        d = h // self.heads
        pos = torch.arange(s, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, s, h))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return F.linear(self.ln_f(x), self.wte.weight)
