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
