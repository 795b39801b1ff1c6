"""An lm-evaluation-harness (0.4.x) language model over this project's GPT model.

:class:`MegatronLM` answers lm-eval's three request types with a built (and loaded) megatron-core
``GPTModel`` and a project tokenizer:

- ``loglikelihood(context, continuation)``: the sum of the continuation tokens' log-probabilities
  (nats) given the context, and whether greedy decoding would produce exactly that continuation.
  Tokens are split as lm-eval's ``TemplateLM`` does (context and context + continuation encoded,
  the continuation is the difference; an empty context becomes the end-of-document token). A
  context + continuation longer than ``seq_length + 1`` tokens loses context tokens from the left,
  as lm-eval's Hugging Face model does (the last token is only predicted, never fed).
- ``loglikelihood_rolling(text)``: the log-likelihood of the whole text, scored in the windows of
  lm-eval's ``utils.get_rolling_token_windows`` (max_seq_len = ``seq_length``, context_len 1,
  the first window conditioned on the end-of-document token) and summed.
- ``generate_until(context, gen_kwargs)``: greedy decoding (argmax over the tokenizer's real
  vocabulary: padded embedding rows are never produced) until a stop string of ``until``, the
  end-of-document token or ``max_gen_toks`` tokens; the text is cut before the first stop string.

Each request is laid out as one segment by ``megatron.data.mtf_dataset.pack_sample`` (the context
is a T0 input, the continuation its target), the same layout T0 finetuning and
``tasks/zero_shot_rank_classification.py`` use, so ``prefix_lm=True`` scores with bidirectional
attention over the context (non-causal decoder). Requests are sorted by length and run
``batch_size`` per forward, right-padded (padding is its own segment, so it changes no score).
Log-probabilities are a softmax over the model's output, as in the training loss: the padding
rows of the vocabulary have ``-inf`` logits (megatron/model/vocab_padding.py), so they take no
probability; greedy choices (``is_greedy``, generation) only consider real token ids.
"""
import copy
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from megatron.data.device_transfer import batch_to_device
from megatron.data.mtf_dataset import pack_sample
from megatron.errors import ConfigError
from megatron.model.masks import attention_structure_from_batch, with_segment_layout

log = logging.getLogger(__name__)

# gen_kwargs with no effect on greedy decoding (lm-eval task files often set them).
_GREEDY_NEUTRAL_KWARGS = {"top_p", "top_k", "num_beams", "num_return_sequences", "min_p",
                          "repetition_penalty"}


class MegatronLM(TemplateLM):
    """lm-eval ``LM`` over ``model`` (a GPTModel in eval mode, one process) and ``tokenizer``
    (any project tokenizer: ``tokenize``, ``detokenize``, ``eod``, ``pad``, ``vocab_size``).

    ``seq_length``: the longest sequence fed to the model (tokens); ``batch_size``: requests
    (or rolling windows) per forward; ``max_gen_toks``: generated tokens when a request's
    gen_kwargs give no ``max_gen_toks``; ``prefix_lm``: bidirectional attention over the context.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, seq_length: int,
                 batch_size: int = 16, max_gen_toks: int = 256, prefix_lm: bool = False,
                 model_info: Optional[Dict] = None):
        super().__init__()
        if seq_length < 2:
            raise ConfigError(f"--seq-length {seq_length}: scoring needs at least 2 tokens")
        if batch_size < 1:
            raise ConfigError(f"--eval-batch-size {batch_size} must be positive")
        if max_gen_toks < 1:
            raise ConfigError(f"--max-gen-toks {max_gen_toks} must be positive")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.seq_length = int(seq_length)
        self._batch_size = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.prefix_lm = bool(prefix_lm)
        self._pad_id = int(getattr(tokenizer, "pad", tokenizer.eod))
        self._num_real_tokens = int(tokenizer.vocab_size)
        self._model_info = dict(model_info or {})

    # ------------------------------------------------------------------ lm-eval's interface
    @property
    def eot_token_id(self) -> int:
        """The end-of-document id: lm-eval's context for an empty context."""
        return int(self.tokenizer.eod)

    @property
    def max_length(self) -> int:
        """Longest token sequence fed to the model (``--seq-length``)."""
        return self.seq_length

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name", type(self.tokenizer).__name__)

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None,
                   **kwargs) -> List[int]:
        """Token ids of ``string`` (the project tokenizers add no special tokens)."""
        return [int(t) for t in self.tokenizer.tokenize(string)]

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.detokenize([int(t) for t in tokens])

    def get_model_info(self) -> Dict:
        """What lm-eval records under ``config`` in its results."""
        return dict(self._model_info, seq_length=self.seq_length, prefix_lm=self.prefix_lm)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False
                              ) -> List[Tuple[float, bool]]:
        """``(log-likelihood, is_greedy)`` of each ``(cache_key, context_ids,
        continuation_ids)`` request, in the order given."""
        pairs = [self._fit(ctx, cont) for _, ctx, cont in requests]
        results = self.score_token_pairs(pairs)
        for (key, _, _), answer in zip(requests, results, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        """Log-likelihood of each request's whole text: the sum over lm-eval's rolling windows."""
        windows, owner = [], []
        for r_i, (text,) in enumerate(req.args for req in requests):
            for window in self.rolling_windows(self.tok_encode(text)):
                windows.append(window)
                owner.append(r_i)
        scores = self.score_token_pairs(windows)
        totals = [0.0] * len(requests)
        for r_i, (score, _) in zip(owner, scores, strict=True):
            totals[r_i] += score
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
        """Greedy continuation text of each ``(context, gen_kwargs)`` request."""
        rows = []
        for context, gen_kwargs in (req.args for req in requests):
            until, max_new = self._greedy_settings(gen_kwargs)
            ctx = self.tok_encode(context) or [self.eot_token_id]
            ctx = ctx[-max(1, self.seq_length - max_new):]
            rows.append({"ctx": ctx, "gen": [], "until": until, "max": max_new, "done": False})
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]["ctx"]))
        for lo in range(0, len(order), self.batch_size):
            self._generate_batch([rows[i] for i in order[lo:lo + self.batch_size]])
        texts = [self._cut(self.tok_decode(r["gen"]), r["until"]) for r in rows]
        for req, text in zip(requests, texts, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return texts

    # ------------------------------------------------------------------ scoring
    def rolling_windows(self, tokens: List[int]) -> List[Tuple[List[int], List[int]]]:
        """(context, continuation) token windows covering ``tokens``, as lm-eval's
        ``get_rolling_token_windows`` + ``make_disjoint_window`` cut them for ``seq_length``."""
        return [make_disjoint_window(w) for w in get_rolling_token_windows(
            token_list=tokens, prefix_token=self.eot_token_id, max_seq_len=self.seq_length,
            context_len=1)]

    def _fit(self, ctx: List[int], cont: List[int]) -> Tuple[List[int], List[int]]:
        """``(ctx, cont)`` with the context cut from the left to fit ``seq_length + 1`` tokens."""
        if not cont:
            return list(ctx[-1:]) or [self.eot_token_id], []
        keep = self.seq_length + 1 - len(cont)
        if keep < 1:
            raise ConfigError(f"a continuation of {len(cont)} tokens cannot be scored with "
                              f"--seq-length {self.seq_length} (at most {self.seq_length} tokens)")
        if not ctx:
            raise ValueError("a loglikelihood request needs at least one context token")
        return list(ctx[-keep:]), list(cont)

    @torch.no_grad()
    def score_token_pairs(self, pairs: Sequence[Tuple[Sequence[int], Sequence[int]]]
                          ) -> List[Tuple[float, bool]]:
        """``(sum of log p(continuation token | preceding tokens), is_greedy)`` per
        ``(context ids, continuation ids)`` pair (together at most ``seq_length + 1`` tokens,
        the context non-empty), ``batch_size`` pairs per forward, longest first."""
        results: List[Tuple[float, bool]] = [(0.0, True)] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        for lo in range(0, len(order), self.batch_size):
            chunk = order[lo:lo + self.batch_size]
            logits, batch = self._forward([pairs[i] for i in chunk], feed_last=False)
            for row, i in enumerate(chunk):
                positions = torch.nonzero(batch["loss_mask"][row] > 0).squeeze(-1)
                if positions.numel() == 0:
                    continue
                scores = logits[row, positions].double()  # sums of many terms: float64
                targets = batch["labels"][row, positions]
                logprobs = torch.log_softmax(scores, dim=-1)
                total = float(logprobs.gather(-1, targets.unsqueeze(-1)).sum())
                greedy = scores[:, :self._num_real_tokens].argmax(dim=-1)
                results[i] = (total, bool(torch.equal(greedy, targets)))
        return results

    def _forward(self, pairs, feed_last: bool):
        """Logits ``[b, s, vocab]`` of the right-padded batch of (context, continuation) pairs,
        each one segment (``pack_sample``), and the batch. Without ``feed_last`` the last token of
        the longest pair is not fed (it is only predicted)."""
        length = max(len(c) + len(t) for c, t in pairs)
        samples = [pack_sample([(np.asarray(c, np.int64), np.asarray(t, np.int64))], length,
                               self._pad_id, prefix_lm=self.prefix_lm) for c, t in pairs]
        fed = length if feed_last else length - 1
        # the segment layout is worked out on the host, then the batch moves in one copy
        batch = batch_to_device(with_segment_layout(
            {k: torch.stack([s[k] for s in samples])[:, :fed] for k in samples[0]}), self.device)
        logits = self.model(batch["tokens"], batch["position_ids"], None,
                            packed_seq_params=attention_structure_from_batch(batch))
        return logits, batch

    # ------------------------------------------------------------------ generation
    def _greedy_settings(self, gen_kwargs) -> Tuple[List[str], int]:
        """(stop strings, max new tokens) of one request's ``gen_kwargs``; sampling is refused."""
        kwargs = copy.deepcopy(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
        if do_sample or temperature > 0:
            raise ConfigError(f"generation kwargs do_sample={do_sample}, temperature={temperature}:"
                              " tasks/eval_harness generates greedily only (do_sample: false, "
                              "temperature: 0)")
        ignored = set(kwargs) - _GREEDY_NEUTRAL_KWARGS
        if ignored:
            log.warning("generation kwargs %s are ignored by greedy decoding", sorted(ignored))
        return [u for u in until if u], max(1, max_new)

    def _generate_batch(self, rows: List[Dict]) -> None:
        """Extend each row's ``gen`` greedily until it is done."""
        while True:
            live = [r for r in rows if not r["done"]]
            if not live:
                return
            pairs = []
            for r in live:
                seq_ctx, gen = r["ctx"], r["gen"]
                overflow = len(seq_ctx) + len(gen) - self.seq_length
                if overflow > 0:  # slide: drop the oldest context, then generated, tokens
                    cut_ctx = min(overflow, len(seq_ctx))
                    seq_ctx, gen = seq_ctx[cut_ctx:], gen[overflow - cut_ctx:]
                pairs.append((seq_ctx, gen))
            logits, _ = self._forward(pairs, feed_last=True)
            for row, (r, (c, g)) in enumerate(zip(live, pairs, strict=True)):
                last = logits[row, len(c) + len(g) - 1, :self._num_real_tokens]
                token = int(last.argmax())
                if token == self.eot_token_id:
                    r["done"] = True
                    continue
                r["gen"].append(token)
                if len(r["gen"]) >= r["max"] or (
                        r["until"] and any(u in self.tok_decode(r["gen"]) for u in r["until"])):
                    r["done"] = True

    @staticmethod
    def _cut(text: str, until: Sequence[str]) -> str:
        """``text`` before the first occurrence of any stop string."""
        for stop in until:
            text = text.split(stop)[0]
        return text
