#!/usr/bin/env python3
"""train.py - trains a small DeepSeek-V3-architecture model and writes it in
DeepSeek-V3's own Hugging Face layout (FP8 e4m3 weights with 128x128
weight_scale_inv, BF16 embeddings/norms/gate/head, F32 e_score_correction_bias,
one multi-token-prediction module under layer index num_hidden_layers).

The architecture follows DeepSeek's reference inference/model.py (the semantics
the engine reproduces): MLA with q_lora (interleaved-pair RoPE on the rope part,
no YaRN: rope_scaling is null), dense layers then MoE layers with the sigmoid
gate, e_score_correction_bias used for selection only, group-limited routing
(the top-2 biased scores of each group rank the groups), weights from the
unbiased scores normalised over the chosen experts times route_scale, shared
experts. Training adds what the DeepSeek-V3 report describes: the aux-loss-free
balancing update of the bias (b_i += gamma * sign(mean load - load_i) after each
step), the sequence-wise balance loss with a tiny alpha, and one MTP module:
h' = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]) through one decoder block, then
shared_head.norm and the shared output head predict t_{i+2}; loss weight 0.3.
h_i is the main model's last hidden state after its final norm (what vLLM and
SGLang pass to DeepSeek-V3's MTP layer). The embedding and the output head are
shared between the main model and the MTP module (the checkpoint stores copies
under both names, as DeepSeek-V3's does).

Steps (one command; see tools/train/README.md):
  1. byte-level BPE tokenizer trained on the training text with DeepSeek-V3's
     pre-tokenizer, normaliser, decoder and added tokens (or --tokenizer DIR),
  2. training (bf16 autocast, AdamW, seeded), the loss curve in loss.tsv, the
     checkpoint with the lowest validation loss kept,
  3. export to FP8, then evaluation of the exported weights exactly as the
     engine sees them (FP8 dequantised, float64): held-out perplexity, unigram
     perplexity, reference logits (main model and MTP module) for tests.
"""
import argparse
import copy
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, asdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BOS, EOS, PAD = '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜▁pad▁｜>'
USER, ASSISTANT = '<｜User｜>', '<｜Assistant｜>'
V3_FIRST_ADDED = 128000  # DeepSeek-V3's added tokens past 0..2 start here


@dataclass
class Args:
    vocab_size: int = 8192
    dim: int = 256
    inter_dim: int = 512
    moe_inter_dim: int = 128
    n_layers: int = 5
    n_dense_layers: int = 1
    n_heads: int = 8
    n_routed_experts: int = 16
    n_shared_experts: int = 2
    n_activated_experts: int = 4
    n_expert_groups: int = 4
    n_limited_groups: int = 2
    route_scale: float = 2.5
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 32
    v_head_dim: int = 32
    rope_theta: float = 10000.0
    max_seq_len: int = 2048
    norm_eps: float = 1e-6


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(v3_dir, texts, vocab_size, out_dir):
    """DeepSeek-V3's tokenizer.json with its BPE model replaced by one trained on
    texts; the added tokens keep their strings and flags, ids 0..2 stay, the rest
    follow the BPE vocabulary in DeepSeek-V3's order. Returns the JSON text."""
    from tokenizers import Tokenizer, trainers, pre_tokenizers
    v3 = json.load(open(os.path.join(v3_dir, 'tokenizer.json'), encoding='utf-8'))
    added = v3['added_tokens']
    first = [a for a in added if a['id'] < 3]
    rest = sorted([a for a in added if a['id'] >= 3], key=lambda a: a['id'])
    assert [a['content'] for a in first] == [BOS, EOS, PAD], first
    n_bpe = vocab_size - len(rest)
    base = copy.deepcopy(v3)
    base['added_tokens'] = []
    base['model']['vocab'] = {}
    base['model']['merges'] = []
    tok = Tokenizer.from_str(json.dumps(base))
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    trained = json.loads(tok.to_str())
    vocab = trained['model']['vocab']
    assert len(vocab) <= n_bpe and all(vocab[s] == i for i, s in enumerate([BOS, EOS, PAD])), len(vocab)
    n_model = len(vocab)
    merges = [m if isinstance(m, str) else ' '.join(m) for m in trained['model']['merges']]
    out = copy.deepcopy(v3)
    out['model']['vocab'] = vocab
    out['model']['merges'] = merges
    new_added = [dict(a) for a in first]
    for k, a in enumerate(rest):
        b = dict(a)
        b['id'] = n_model + k
        new_added.append(b)
    out['added_tokens'] = new_added
    text = json.dumps(out, ensure_ascii=False, indent=2)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, 'tokenizer.json'), 'w', encoding='utf-8') as f:
        f.write(text)
    cfg = json.load(open(os.path.join(v3_dir, 'tokenizer_config.json'), encoding='utf-8'))
    cfg['model_max_length'] = 2048
    with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    return n_model + len(rest)


# ---------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def rope_tables(a, T, device, dtype):
    d = a.qk_rope_head_dim
    freqs = 1.0 / (a.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    return ang.cos().to(device, dtype), ang.sin().to(device, dtype)


def apply_rope(x, cos, sin):
    """The reference's view_as_complex rotation: pairs (x[2j], x[2j+1])."""
    xf = x if x.dtype == torch.float64 else x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    c, s = cos[:, None, :].to(xf.dtype), sin[:, None, :].to(xf.dtype)
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2).to(x.dtype)


def lin(i, o):
    return nn.Linear(i, o, bias=False)


class MLA(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        H, qk = a.n_heads, a.qk_nope_head_dim + a.qk_rope_head_dim
        self.wq_a = lin(a.dim, a.q_lora_rank)
        self.q_norm = RMSNorm(a.q_lora_rank, a.norm_eps)
        self.wq_b = lin(a.q_lora_rank, H * qk)
        self.wkv_a = lin(a.dim, a.kv_lora_rank + a.qk_rope_head_dim)
        self.kv_norm = RMSNorm(a.kv_lora_rank, a.norm_eps)
        self.wkv_b = lin(a.kv_lora_rank, H * (a.qk_nope_head_dim + a.v_head_dim))
        self.wo = lin(H * a.v_head_dim, a.dim)
        self.scale = qk ** -0.5  # no YaRN: no mscale correction

    def forward(self, x, cos, sin, exact):
        a, (B, T, _) = self.a, x.shape
        H, qk = a.n_heads, a.qk_nope_head_dim + a.qk_rope_head_dim
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, qk)
        q_nope, q_pe = q.split([a.qk_nope_head_dim, a.qk_rope_head_dim], -1)
        q_pe = apply_rope(q_pe, cos, sin)
        kv, k_pe = self.wkv_a(x).split([a.kv_lora_rank, a.qk_rope_head_dim], -1)
        k_pe = apply_rope(k_pe.unsqueeze(2), cos, sin)
        kv = self.wkv_b(self.kv_norm(kv)).view(B, T, H, a.qk_nope_head_dim + a.v_head_dim)
        k_nope, v = kv.split([a.qk_nope_head_dim, a.v_head_dim], -1)
        q = torch.cat([q_nope, q_pe], -1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, H, -1)], -1)
        if exact:
            sc = torch.einsum('bshd,bthd->bsht', q, k) * self.scale
            mask = torch.full((T, T), float('-inf'), device=x.device, dtype=sc.dtype).triu_(1)
            p = (sc + mask[:, None, :]).softmax(-1)
            o = torch.einsum('bsht,bthd->bshd', p, v)
        else:
            vt = F.pad(v, (0, qk - a.v_head_dim))
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), vt.transpose(1, 2),
                                               is_causal=True, scale=self.scale)
            o = o[..., :a.v_head_dim].transpose(1, 2)
        return self.wo(o.reshape(B, T, H * a.v_head_dim))


class MLP(nn.Module):
    def __init__(self, dim, inter):
        super().__init__()
        self.w1, self.w2, self.w3 = lin(dim, inter), lin(inter, dim), lin(dim, inter)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Routed experts as stacked (E, out, in) weights; every expert runs on every
    token and a zero routing weight removes the unchosen ones, which equals the
    reference's gather/scatter and avoids a host sync per expert."""

    def __init__(self, a):
        super().__init__()
        self.a = a
        E, I, D = a.n_routed_experts, a.moe_inter_dim, a.dim
        self.gate = nn.Parameter(torch.empty(E, D))
        self.register_buffer('bias', torch.zeros(E, dtype=torch.float32))
        self.w1 = nn.Parameter(torch.empty(E, I, D))
        self.w2 = nn.Parameter(torch.empty(E, D, I))
        self.w3 = nn.Parameter(torch.empty(E, I, D))
        self.shared_experts = MLP(D, a.n_shared_experts * I)
        self.register_buffer('load', torch.zeros(E, dtype=torch.float32), persistent=False)
        self.aux = None

    def route(self, x):
        a, N = self.a, x.shape[0]
        with torch.autocast(x.device.type, enabled=False):
            hp = torch.float64 if x.dtype == torch.float64 else torch.float32
            scores = F.linear(x.to(hp), self.gate.to(hp)).sigmoid()
        biased = scores + self.bias.to(scores.dtype)
        G = a.n_expert_groups
        grouped = biased.view(N, G, -1)
        group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
        keep = group_scores.topk(a.n_limited_groups, dim=-1)[1]
        drop = torch.ones(N, G, dtype=torch.bool, device=x.device).scatter_(1, keep, False)
        biased = grouped.masked_fill(drop.unsqueeze(-1), float('-inf')).flatten(1)
        idx = biased.topk(a.n_activated_experts, dim=-1)[1]
        w = scores.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * a.route_scale
        return w, idx, scores

    def forward(self, x):
        a, shape = self.a, x.shape
        x2 = x.reshape(-1, a.dim)
        w, idx, scores = self.route(x2)
        dense_w = torch.zeros_like(scores).scatter(1, idx, w)
        if self.training:
            E, K = a.n_routed_experts, a.n_activated_experts
            sel = torch.zeros_like(scores).scatter(1, idx, 1.0)
            self.load += sel.detach().sum(0)
            B = shape[0] if len(shape) == 3 else 1
            f = sel.view(B, -1, E).mean(1) * (E / K)
            p = (scores / scores.sum(-1, keepdim=True)).view(B, -1, E).mean(1)
            self.aux = (f * p).sum(-1).mean()
        dt = torch.bfloat16 if torch.is_autocast_enabled(x.device.type) else x2.dtype
        xe = x2.to(dt)
        h1 = torch.einsum('nd,eid->nei', xe, self.w1.to(dt))
        h3 = torch.einsum('nd,eid->nei', xe, self.w3.to(dt))
        act = F.silu(h1) * h3 * dense_w.unsqueeze(-1).to(h1.dtype)
        y = torch.einsum('nei,edi->nd', act, self.w2.to(dt))
        return (y + self.shared_experts(x2)).view(shape)


class Block(nn.Module):
    def __init__(self, a, moe, dropout):
        super().__init__()
        self.attn_norm = RMSNorm(a.dim, a.norm_eps)
        self.attn = MLA(a)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.ffn = MoE(a) if moe else MLP(a.dim, a.inter_dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, cos, sin, exact=False):
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, exact))
        return x + self.drop(self.ffn(self.ffn_norm(x)))


class MTP(nn.Module):
    def __init__(self, a, dropout):
        super().__init__()
        self.enorm = RMSNorm(a.dim, a.norm_eps)
        self.hnorm = RMSNorm(a.dim, a.norm_eps)
        self.eh_proj = lin(2 * a.dim, a.dim)
        self.block = Block(a, a.n_layers >= a.n_dense_layers, dropout)
        self.head_norm = RMSNorm(a.dim, a.norm_eps)


class Transformer(nn.Module):
    def __init__(self, a, dropout=0.0):
        super().__init__()
        self.a = a
        self.embed = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList([Block(a, i >= a.n_dense_layers, dropout) for i in range(a.n_layers)])
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.head = lin(a.dim, a.vocab_size)
        self.mtp = MTP(a, dropout)

    def moes(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def forward(self, tokens, exact=False):
        """Main logits and the final-normed hidden state h (B, T, dim)."""
        T = tokens.shape[1]
        dt = torch.float64 if exact else torch.float32
        cos, sin = rope_tables(self.a, T, tokens.device, dt)
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, exact)
        h = self.norm(h)
        return self.head(h), h

    def mtp_forward(self, h, next_tokens, exact=False):
        """MTP logits at positions 0..T-1 from h (B, T, dim) and next_tokens =
        the tokens at positions 1..T (B, T): each row predicts the token two
        positions ahead."""
        T = next_tokens.shape[1]
        dt = torch.float64 if exact else torch.float32
        cos, sin = rope_tables(self.a, T, h.device, dt)
        m = self.mtp
        x = m.eh_proj(torch.cat([m.enorm(self.embed(next_tokens)), m.hnorm(h)], -1))
        x = m.block(x, cos, sin, exact)
        return self.head(m.head_norm(x))


def init_weights(model, std=0.02):
    for n, p in model.named_parameters():
        if n.endswith('norm.weight'):
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, 0.0, std)


# ---------------------------------------------------------------- FP8 export

def fp8_quant(w):
    """(out, in) float -> e4m3 weights and float32 scales per 128x128 block
    (weight = fp8 * scale, DeepSeek-V3's weight_scale_inv)."""
    w = w.detach().float()
    O, I = w.shape
    bo, bi = -(-O // 128), -(-I // 128)
    wp = F.pad(w, (0, bi * 128 - I, 0, bo * 128 - O)).view(bo, 128, bi, 128)
    s = wp.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (wp / s[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(bo * 128, bi * 128)[:O, :I].contiguous(), s.contiguous()


def fp8_dequant(q, s):
    O, I = q.shape
    full = s.repeat_interleave(128, 0)[:O].repeat_interleave(128, 1)[:, :I]
    return q.to(torch.float64) * full.to(torch.float64)


def hf_state(model):
    a = model.a
    out = {}

    def fp8(name, w):
        q, s = fp8_quant(w)
        out[name + '.weight'] = q.cpu()
        out[name + '.weight_scale_inv'] = s.cpu()

    def bf16(name, w):
        out[name] = w.detach().to(torch.bfloat16).cpu().contiguous().clone()

    def block(p, b):
        bf16(p + '.input_layernorm.weight', b.attn_norm.weight)
        bf16(p + '.post_attention_layernorm.weight', b.ffn_norm.weight)
        at, m = b.attn, p + '.self_attn'
        fp8(m + '.q_a_proj', at.wq_a.weight)
        bf16(m + '.q_a_layernorm.weight', at.q_norm.weight)
        fp8(m + '.q_b_proj', at.wq_b.weight)
        fp8(m + '.kv_a_proj_with_mqa', at.wkv_a.weight)
        bf16(m + '.kv_a_layernorm.weight', at.kv_norm.weight)
        fp8(m + '.kv_b_proj', at.wkv_b.weight)
        fp8(m + '.o_proj', at.wo.weight)
        f = b.ffn
        if isinstance(f, MLP):
            fp8(p + '.mlp.gate_proj', f.w1.weight)
            fp8(p + '.mlp.up_proj', f.w3.weight)
            fp8(p + '.mlp.down_proj', f.w2.weight)
            return
        bf16(p + '.mlp.gate.weight', f.gate)
        out[p + '.mlp.gate.e_score_correction_bias'] = f.bias.detach().float().cpu().clone()
        for e in range(a.n_routed_experts):
            fp8(p + f'.mlp.experts.{e}.gate_proj', f.w1[e])
            fp8(p + f'.mlp.experts.{e}.up_proj', f.w3[e])
            fp8(p + f'.mlp.experts.{e}.down_proj', f.w2[e])
        fp8(p + '.mlp.shared_experts.gate_proj', f.shared_experts.w1.weight)
        fp8(p + '.mlp.shared_experts.up_proj', f.shared_experts.w3.weight)
        fp8(p + '.mlp.shared_experts.down_proj', f.shared_experts.w2.weight)

    bf16('model.embed_tokens.weight', model.embed.weight)
    for i, b in enumerate(model.layers):
        block(f'model.layers.{i}', b)
    bf16('model.norm.weight', model.norm.weight)
    bf16('lm_head.weight', model.head.weight)
    p, m = f'model.layers.{a.n_layers}', model.mtp
    bf16(p + '.embed_tokens.weight', model.embed.weight)
    bf16(p + '.enorm.weight', m.enorm.weight)
    bf16(p + '.hnorm.weight', m.hnorm.weight)
    bf16(p + '.eh_proj.weight', m.eh_proj.weight)
    block(p, m.block)
    bf16(p + '.shared_head.norm.weight', m.head_norm.weight)
    bf16(p + '.shared_head.head.weight', model.head.weight)
    return out


def engine_view(state, a, device):
    """A float64 Transformer holding exactly the exported weights (FP8
    dequantised as float32(fp8) * scale, BF16 widened); the MTP module's
    embedding and head are its own copies."""
    m = Transformer(a).to(device=device, dtype=torch.float64).eval()

    def w(name):
        t = state[name]
        if t.dtype == torch.float8_e4m3fn:
            return fp8_dequant(t, state[name[:-len('.weight')] + '.weight_scale_inv'])
        return t.to(torch.float64)

    def block(p, b):
        b.attn_norm.weight.data = w(p + '.input_layernorm.weight')
        b.ffn_norm.weight.data = w(p + '.post_attention_layernorm.weight')
        at, s = b.attn, p + '.self_attn'
        at.wq_a.weight.data = w(s + '.q_a_proj.weight')
        at.q_norm.weight.data = w(s + '.q_a_layernorm.weight')
        at.wq_b.weight.data = w(s + '.q_b_proj.weight')
        at.wkv_a.weight.data = w(s + '.kv_a_proj_with_mqa.weight')
        at.kv_norm.weight.data = w(s + '.kv_a_layernorm.weight')
        at.wkv_b.weight.data = w(s + '.kv_b_proj.weight')
        at.wo.weight.data = w(s + '.o_proj.weight')
        f = b.ffn
        if isinstance(f, MLP):
            f.w1.weight.data, f.w3.weight.data, f.w2.weight.data = (
                w(p + '.mlp.gate_proj.weight'), w(p + '.mlp.up_proj.weight'), w(p + '.mlp.down_proj.weight'))
            return
        f.gate.data = w(p + '.mlp.gate.weight')
        f.bias.data = state[p + '.mlp.gate.e_score_correction_bias'].to(torch.float64)
        E = a.n_routed_experts
        f.w1.data = torch.stack([w(p + f'.mlp.experts.{e}.gate_proj.weight') for e in range(E)])
        f.w3.data = torch.stack([w(p + f'.mlp.experts.{e}.up_proj.weight') for e in range(E)])
        f.w2.data = torch.stack([w(p + f'.mlp.experts.{e}.down_proj.weight') for e in range(E)])
        se = f.shared_experts
        se.w1.weight.data = w(p + '.mlp.shared_experts.gate_proj.weight')
        se.w3.weight.data = w(p + '.mlp.shared_experts.up_proj.weight')
        se.w2.weight.data = w(p + '.mlp.shared_experts.down_proj.weight')

    with torch.no_grad():
        m.embed.weight.data = w('model.embed_tokens.weight')
        for i, b in enumerate(m.layers):
            block(f'model.layers.{i}', b)
        m.norm.weight.data = w('model.norm.weight')
        m.head.weight.data = w('lm_head.weight')
        p = f'model.layers.{a.n_layers}'
        block(p, m.mtp.block)
        m.mtp.enorm.weight.data = w(p + '.enorm.weight')
        m.mtp.hnorm.weight.data = w(p + '.hnorm.weight')
        m.mtp.eh_proj.weight.data = w(p + '.eh_proj.weight')
        m.mtp.head_norm.weight.data = w(p + '.shared_head.norm.weight')
        assert torch.equal(w(p + '.embed_tokens.weight'), m.embed.weight.data)
        assert torch.equal(w(p + '.shared_head.head.weight'), m.head.weight.data)
    m.to(device)
    return m


def hf_config(a, n_vocab_tok):
    return {
        'architectures': ['DeepseekV3ForCausalLM'],
        'model_type': 'deepseek_v3',
        'bos_token_id': 0,
        'eos_token_id': 1,
        'first_k_dense_replace': a.n_dense_layers,
        'hidden_act': 'silu',
        'hidden_size': a.dim,
        'intermediate_size': a.inter_dim,
        'kv_lora_rank': a.kv_lora_rank,
        'max_position_embeddings': a.max_seq_len,
        'moe_intermediate_size': a.moe_inter_dim,
        'moe_layer_freq': 1,
        'n_group': a.n_expert_groups,
        'n_routed_experts': a.n_routed_experts,
        'n_shared_experts': a.n_shared_experts,
        'norm_topk_prob': True,
        'num_attention_heads': a.n_heads,
        'num_experts_per_tok': a.n_activated_experts,
        'num_hidden_layers': a.n_layers,
        'num_key_value_heads': a.n_heads,
        'num_nextn_predict_layers': 1,
        'q_lora_rank': a.q_lora_rank,
        'qk_nope_head_dim': a.qk_nope_head_dim,
        'qk_rope_head_dim': a.qk_rope_head_dim,
        'quantization_config': {'activation_scheme': 'dynamic', 'fmt': 'e4m3', 'quant_method': 'fp8',
                                'weight_block_size': [128, 128]},
        'rms_norm_eps': a.norm_eps,
        'rope_scaling': None,
        'rope_theta': a.rope_theta,
        'routed_scaling_factor': a.route_scale,
        'scoring_func': 'sigmoid',
        'tie_word_embeddings': False,
        'topk_group': a.n_limited_groups,
        'topk_method': 'noaux_tc',
        'torch_dtype': 'bfloat16',
        'v_head_dim': a.v_head_dim,
        'vocab_size': a.vocab_size,
    }


def save_sharded(state, out_dir, max_bytes):
    """model-0000k-of-0000n.safetensors of at most max_bytes each (in name order)
    and model.safetensors.index.json, as DeepSeek-V3's checkpoint is laid out."""
    from safetensors.torch import save_file
    shards, cur, size = [], {}, 0
    for name in sorted(state):
        nb = state[name].numel() * state[name].element_size()
        if cur and size + nb > max_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = state[name]
        size += nb
    shards.append(cur)
    wm, total = {}, 0
    for k, sh in enumerate(shards):
        fn = f'model-{k + 1:05d}-of-{len(shards):05d}.safetensors'
        save_file(sh, os.path.join(out_dir, fn), metadata={'format': 'pt'})
        for n, t in sh.items():
            wm[n] = fn
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {'total_size': total}, 'weight_map': wm}, f, indent=2, sort_keys=True)


def load_sharded(out_dir):
    from safetensors.torch import load_file
    idx = json.load(open(os.path.join(out_dir, 'model.safetensors.index.json')))
    state = {}
    for fn in sorted(set(idx['weight_map'].values())):
        state.update(load_file(os.path.join(out_dir, fn)))
    return state


# ---------------------------------------------------------------- data

def read_jsonl(path):
    with open(path, encoding='utf-8') as f:
        return [json.loads(l) for l in f if l.strip()]


class Data:
    def __init__(self, tok, data_dir, seed):
        self.tok = tok
        self.bos, self.eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
        self.user, self.asst = tok.token_to_id(USER), tok.token_to_id(ASSISTANT)
        enc = lambda xs: [e.ids for e in tok.encode_batch(xs, add_special_tokens=False)]
        train = read_jsonl(os.path.join(data_dir, 'train.jsonl'))
        chat = read_jsonl(os.path.join(data_dir, 'chat.jsonl'))
        items = [[self.bos] + ids for ids in enc([d['text'] for d in train])]
        self.n_doc_tokens = sum(len(x) for x in items)
        qs, ans = enc([c['q'] for c in chat]), enc([c['a'] for c in chat])
        chat_items = [[self.bos, self.user] + q + [self.asst] + r + [self.eos] for q, r in zip(qs, ans)]
        self.n_chat_tokens = sum(len(x) for x in chat_items)
        items += chat_items
        order = np.random.RandomState(seed).permutation(len(items))
        self.train = np.concatenate([np.asarray(items[i], dtype=np.int64) for i in order])
        self.valid = self.stream(read_jsonl(os.path.join(data_dir, 'valid.jsonl')))
        with open(os.path.join(data_dir, 'test.txt'), encoding='utf-8') as f:
            self.test_text = f.read()
        self.test = np.asarray([self.bos] + tok.encode(self.test_text, add_special_tokens=False).ids, dtype=np.int64)
        self.test_docs = read_jsonl(os.path.join(data_dir, 'test.jsonl'))

    def stream(self, docs):
        ids = self.tok.encode_batch([d['text'] for d in docs], add_special_tokens=False)
        return np.concatenate([np.asarray([self.bos] + e.ids, dtype=np.int64) for e in ids])

    def chat_ids(self, q, answer=''):
        ids = [self.bos, self.user] + self.tok.encode(q, add_special_tokens=False).ids + [self.asst]
        return ids + (self.tok.encode(answer, add_special_tokens=False).ids if answer else [])


def windows(stream, T):
    """Non-overlapping (T+2)-token windows (inputs, next, next-next), stride T."""
    n = (len(stream) - 2) // T
    return np.stack([stream[i * T:i * T + T + 2] for i in range(n)])


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def eval_loss(model, win, bs, device, exact=False):
    """Mean cross-entropy of the main model and of the MTP module over windows."""
    model.eval()
    tot = tot_mtp = 0.0
    n = n_mtp = 0
    for i in range(0, len(win), bs):
        w = torch.from_numpy(win[i:i + bs]).to(device)
        T = w.shape[1] - 2
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=not exact and device.type == 'cuda'):
            logits, h = model(w[:, :T], exact)
            ml = model.mtp_forward(h, w[:, 1:T + 1], exact)
        tot += F.cross_entropy(logits.double().flatten(0, 1), w[:, 1:T + 1].flatten(), reduction='sum').item()
        tot_mtp += F.cross_entropy(ml.double().flatten(0, 1), w[:, 2:T + 2].flatten(), reduction='sum').item()
        n += w[:, 1:T + 1].numel()
        n_mtp += w[:, 2:T + 2].numel()
    model.train()
    return tot / n, tot_mtp / n_mtp


@torch.no_grad()
def perplexity(model, ids, ctx, device, exact, bs=8):
    """Two definitions over the held-out token ids (BOS first):
    'all': windows ids[s:s+ctx] for s = 0, ctx, 2ctx, ..., every next token
    scored (the last window shorter); 'llama': llama-perplexity's chunks of ctx
    tokens, the first set to BOS, the second half's next tokens scored."""
    model.eval()
    res = {}
    nll, cnt = 0.0, 0
    starts = list(range(0, len(ids) - 1, ctx))
    for i in range(0, len(starts), bs):
        for s in starts[i:i + bs]:
            x = torch.from_numpy(ids[s:s + ctx]).to(device)[None]
            y = torch.from_numpy(ids[s + 1:s + ctx + 1]).to(device)
            x = x[:, :y.numel()]
            with torch.autocast('cuda', dtype=torch.bfloat16, enabled=not exact):
                lg, _ = model(x, exact)
            nll += F.cross_entropy(lg[0].double(), y, reduction='sum').item()
            cnt += y.numel()
    res['all'] = {'ctx': ctx, 'tokens_scored': cnt, 'nll': nll / cnt, 'ppl': math.exp(nll / cnt)}
    nll, cnt = 0.0, 0
    n_chunk = len(ids) // ctx
    for c in range(n_chunk):
        x = torch.from_numpy(ids[c * ctx:(c + 1) * ctx].copy()).to(device)
        x[0] = int(ids[0])
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=not exact):
            lg, _ = model(x[None], exact)
        first = ctx // 2
        nll += F.cross_entropy(lg[0, first:ctx - 1].double(), x[first + 1:], reduction='sum').item()
        cnt += ctx - 1 - first
    res['llama'] = {'ctx': ctx, 'chunks': n_chunk, 'tokens_scored': cnt, 'nll': nll / cnt,
                    'ppl': math.exp(nll / cnt)}
    model.train()
    return res


def unigram_ppl(train_ids, test_ids, V):
    """Add-one unigram model from the training stream, scored on the same
    predicted tokens as perplexity()'s 'all' (test_ids[1:])."""
    counts = np.bincount(train_ids, minlength=V).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(math.exp(-logp[test_ids[1:]].mean()))


@torch.no_grad()
def sample(model, ids, n, temp, gen, eos, exact=False):
    model.eval()
    x = torch.tensor(ids, device=next(model.parameters()).device)[None]
    out = []
    for _ in range(n):
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=not exact):
            lg, _ = model(x, exact)
        p = (lg[0, -1].double() / temp).softmax(-1)
        t = torch.multinomial(p.cpu(), 1, generator=gen).item()
        if t == eos:
            break
        out.append(t)
        x = torch.cat([x, torch.tensor([[t]], device=x.device)], 1)
    model.train()
    return out


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--data', required=True, help='folder with train/valid/test.jsonl, chat.jsonl, test.txt')
    ap.add_argument('--v3-tokenizer', help="folder with DeepSeek-V3's tokenizer.json and tokenizer_config.json")
    ap.add_argument('--tokenizer', help='folder with an already trained tokenizer.json (skips training one)')
    ap.add_argument('--out', required=True)
    ap.add_argument('--steps', type=int, default=2000)
    ap.add_argument('--batch', type=int, default=32)
    ap.add_argument('--seq', type=int, default=512)
    ap.add_argument('--lr', type=float, default=2e-3)
    ap.add_argument('--warmup', type=int, default=100)
    ap.add_argument('--wd', type=float, default=0.1)
    ap.add_argument('--dropout', type=float, default=0.1)
    ap.add_argument('--mtp-weight', type=float, default=0.3)
    ap.add_argument('--bias-gamma', type=float, default=1e-3)
    ap.add_argument('--aux-alpha', type=float, default=1e-4)
    ap.add_argument('--eval-every', type=int, default=100)
    ap.add_argument('--seed', type=int, default=1234)
    ap.add_argument('--max-shard-mb', type=float, default=12.0)
    ap.add_argument('--time-limit', type=float, default=0, help='stop training after this many seconds (0: none)')
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    out = args.out
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, 'train.log'), 'w')

    def say(*xs):
        s = ' '.join(str(x) for x in xs)
        print(s, flush=True)
        log.write(s + '\n')
        log.flush()

    a = Args()
    from tokenizers import Tokenizer
    if args.tokenizer:
        tok_dir = args.tokenizer
    else:
        train_docs = read_jsonl(os.path.join(args.data, 'train.jsonl'))
        n = train_tokenizer(args.v3_tokenizer, [d['text'] for d in train_docs], a.vocab_size, out)
        tok_dir = out
        say(f'tokenizer: {n} tokens trained in {time.time() - t_start:.1f} s')
    tok = Tokenizer.from_file(os.path.join(tok_dir, 'tokenizer.json'))
    assert tok.get_vocab_size() <= a.vocab_size
    if tok_dir != out:
        for fn in ('tokenizer.json', 'tokenizer_config.json'):
            with open(os.path.join(tok_dir, fn), 'rb') as f, open(os.path.join(out, fn), 'wb') as g:
                g.write(f.read())
    data = Data(tok, args.data, args.seed)
    say(f'data: train stream {len(data.train)} tokens (documents {data.n_doc_tokens}, chat {data.n_chat_tokens}), '
        f'valid {len(data.valid)}, test {len(data.test)}')

    model = Transformer(a, args.dropout).to(device)
    init_weights(model)
    n_params = sum(p.numel() for p in model.parameters())
    say(f'model: {n_params / 1e6:.2f} M parameters (embedding and head shared with the MTP module), {asdict(a)}')
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': args.wd}, {'params': no_decay, 'weight_decay': 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == 'cuda')
    T = args.seq
    valid_win = windows(data.valid, T)
    rng = np.random.RandomState(args.seed + 1)
    lossf = open(os.path.join(out, 'loss.tsv'), 'w')
    lossf.write('step\ttokens\tseconds\tlr\ttrain_loss\ttrain_mtp_loss\tbalance_loss\tvalid_loss\tvalid_mtp_loss\n')
    best, best_state, best_step = float('inf'), None, 0
    moes = model.moes()
    t0 = time.time()
    run_l = run_m = run_b = 0.0
    nrun = 0
    step = 0
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g['lr'] = lr
        starts = rng.randint(0, len(data.train) - T - 2, size=args.batch)
        w = torch.from_numpy(np.stack([data.train[s:s + T + 2] for s in starts])).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == 'cuda'):
            logits, h = model(w[:, :T])
            ml = model.mtp_forward(h, w[:, 1:T + 1])
        loss_main = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:T + 1].flatten())
        loss_mtp = F.cross_entropy(ml.float().flatten(0, 1), w[:, 2:T + 2].flatten())
        bal = sum(m.aux for m in moes)
        loss = loss_main + args.mtp_weight * loss_mtp + args.aux_alpha * bal
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for m in moes:  # aux-loss-free balancing: raise the bias of underloaded experts
                m.bias += args.bias_gamma * torch.sign(m.load.mean() - m.load)
                m.load.zero_()
        run_l += loss_main.detach()
        run_m += loss_mtp.detach()
        run_b += bal.detach()
        nrun += 1
        last = step == args.steps or (args.time_limit and time.time() - t_start > args.time_limit)
        if step % 10 == 0 or last or step % args.eval_every == 0:
            vl = vm = ''
            if step % args.eval_every == 0 or last:
                vl, vm = eval_loss(model, valid_win, 32, device)
                if vl < best:
                    best, best_step = vl, step
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            el = time.time() - t0
            tl, tm, tb = (x.item() / nrun for x in (run_l, run_m, run_b))
            lossf.write(f'{step}\t{step * args.batch * T}\t{el:.1f}\t{lr:.3e}\t{tl:.4f}\t{tm:.4f}\t{tb:.4f}\t'
                        f'{vl if vl == "" else f"{vl:.4f}"}\t{vm if vm == "" else f"{vm:.4f}"}\n')
            lossf.flush()
            if vl != '' or step % 100 == 0:
                say(f'step {step} {el:.0f}s lr {lr:.2e} train {tl:.3f} mtp {tm:.3f} bal {tb:.3f}'
                    + (f' valid {vl:.3f} valid_mtp {vm:.3f}' if vl != '' else ''))
            run_l = run_m = run_b = 0.0
            nrun = 0
        if last:
            break
    train_s = time.time() - t0
    say(f'training: {step} steps in {train_s:.0f} s; best valid loss {best:.4f} at step {best_step}')
    model.load_state_dict(best_state)
    loads = [m.bias.tolist() for m in moes]

    # export
    state = hf_state(model)
    with open(os.path.join(out, 'config.json'), 'w') as f:
        json.dump(hf_config(a, tok.get_vocab_size()), f, indent=2)
    save_sharded(state, out, int(args.max_shard_mb * 1e6))
    state = load_sharded(out)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith('.safetensors'))
    say(f'export: {len(state)} tensors, {size / 1e6:.2f} MB of safetensors')

    # evaluation of what the engine sees
    ev = engine_view(state, a, device)
    train_eval_win = windows(data.train[:len(data.valid)], T)
    metrics = {
        'steps': step, 'best_step': best_step, 'train_seconds': round(train_s, 1), 'batch': args.batch, 'seq': T,
        'tokens_seen': step * args.batch * T, 'train_stream_tokens': int(len(data.train)),
        'doc_tokens': data.n_doc_tokens, 'chat_tokens': data.n_chat_tokens, 'parameters': n_params,
        'checkpoint_bytes': size, 'gate_bias': loads,
    }
    tl_bf, tm_bf = eval_loss(model, train_eval_win, 32, device)
    vl_bf, vm_bf = eval_loss(model, valid_win, 32, device)
    metrics['bf16_trained'] = {'train_loss_sample': tl_bf, 'train_mtp_loss_sample': tm_bf,
                               'valid_loss': vl_bf, 'valid_mtp_loss': vm_bf,
                               'test_ppl': perplexity(model, data.test, T, device, exact=False)}
    vl, vm = eval_loss(ev, valid_win, 8, device, exact=True)
    tl, tm = eval_loss(ev, train_eval_win, 8, device, exact=True)
    test_win = windows(data.test, T)
    sl, sm = eval_loss(ev, test_win, 8, device, exact=True)
    metrics['fp8_float64'] = {'train_loss_sample': tl, 'train_mtp_loss_sample': tm, 'valid_loss': vl,
                              'valid_mtp_loss': vm, 'test_loss': sl, 'test_mtp_loss': sm,
                              'test_ppl': perplexity(ev, data.test, T, device, exact=True)}
    metrics['unigram_test_ppl'] = unigram_ppl(data.train, data.test, a.vocab_size)
    metrics['test_tokens'] = int(len(data.test))
    say('metrics:', json.dumps(metrics, indent=1))

    # reference logits for the engine's tests
    d0 = data.test_docs
    para = d0[3]['text'].split('\n')[0]
    seqs = {
        's24': ([data.bos] + tok.encode(d0[0]['text'], add_special_tokens=False).ids)[:24],
        's64': ([data.bos] + tok.encode(d0[12]['text'], add_special_tokens=False).ids)[:64],
        'chat160': data.chat_ids('Tell me about the weather.', para)[:160],
    }
    ref = {}
    meta = {'sequences': {}, 'note': 'float64 logits of the exported FP8 weights, dequantised; rows = positions'}
    for name, ids in seqs.items():
        n = len(ids)
        x = torch.tensor(ids, device=device)[None]
        with torch.no_grad():
            lg, h = ev(x, exact=True)
            ml = ev.mtp_forward(h[:, :n - 1], x[:, 1:], exact=True)
        rows = list(range(n)) if n <= 24 else sorted(set(range(0, n, 8)) | {n - 1})
        mrows = list(range(n - 1)) if n <= 24 else sorted(set(range(0, n - 1, 16)) | {n - 2})
        ref[f'{name}/tokens'] = torch.tensor(ids, dtype=torch.int32)
        ref[f'{name}/rows'] = torch.tensor(rows, dtype=torch.int32)
        ref[f'{name}/logits'] = lg[0, rows].float().cpu().contiguous()
        ref[f'{name}/mtp_rows'] = torch.tensor(mrows, dtype=torch.int32)
        ref[f'{name}/mtp_logits'] = ml[0, mrows].float().cpu().contiguous()
        meta['sequences'][name] = {'tokens': ids, 'rows': rows, 'mtp_rows': mrows,
                                   'argmax': lg[0, rows].argmax(-1).tolist(), 'text': tok.decode(ids, skip_special_tokens=False)}
    from safetensors.torch import save_file
    save_file(ref, os.path.join(out, 'ref_logits.safetensors'))
    meta['metrics'] = metrics
    with open(os.path.join(out, 'metrics.json'), 'w') as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)

    # what the engine should say, roughly
    gen = torch.Generator().manual_seed(args.seed)
    prompts = ['Tell me about the city.', 'Write a few sentences about the sea.', 'Describe the church.',
               'Continue this text: The old man walked slowly down the road.', 'Write a paragraph in the style of a news report.']
    with open(os.path.join(out, 'samples.txt'), 'w') as f:
        for p in prompts:
            o = sample(model, data.chat_ids(p), 60, 0.7, gen, data.eos)
            s = f'{p}\n  -> {tok.decode(o)}\n'
            f.write(s)
            say(s)
        o = sample(model, [data.bos], 60, 0.8, gen, data.eos)
        f.write(f'[unconditional]\n  -> {tok.decode(o)}\n')
        say(f'[unconditional] -> {tok.decode(o)}')
    say(f'total {time.time() - t_start:.0f} s')


if __name__ == '__main__':
    main()
