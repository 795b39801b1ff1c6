"""Evaluation on checkpoints: tasks/eval_harness (lm-eval 0.4 ``LM`` over our model, run through
``lm_eval.simple_evaluate`` on local task files) and the per-example ``choice_scores`` of
tasks/zero_shot_rank_classification.py. Every score is checked against a hand computation from
the model's logits on the unpadded sequence (plain causal attention, or the prefix structure)."""
import json
import math
import os
import re

import pytest
import torch

from helpers.eval_tasks import MC_DOCS, PPL_DOCS, task_files
from helpers.flags import TINY_MODEL

SEQ = 32
# wide weights (--init-method-std 0.15): peaked distributions, no argmax ties
MODEL = TINY_MODEL + ["--seq-length", str(SEQ), "--transformer-impl", "local", "--seed", "11",
                      "--init-method-std", "0.15"]
ITERATION = 3


# ------------------------------------------------------------------ fixtures and hand scoring
@pytest.fixture(scope="module")
def tiny(tmp_path_factory, dist_group):
    """A random tiny model and its checkpoint (iteration 3; iteration 2 holds other weights)
    in DeepSpeed's layout: {"args", "model", "tokenizer", "load"}."""
    from megatron.checkpoint.reader import MODEL_STATES
    from tasks.checkpoint_model import build_model
    from tasks.eval_harness import evaluate

    args = evaluate.parse_eval_args(MODEL + ["--tasks", "unused"])
    model = build_model(args)
    load = tmp_path_factory.mktemp("eval_ckpt")
    for it, shift in ((ITERATION, 0.0), (ITERATION - 1, 0.05)):
        state = {k: (v + shift if torch.is_tensor(v) and v.is_floating_point() else v)
                 for k, v in model.state_dict().items()}
        os.makedirs(load / f"iter_{it:07d}")
        torch.save({"module": state}, load / f"iter_{it:07d}" / MODEL_STATES)
    (load / "latest_checkpointed_iteration.txt").write_text(f"{ITERATION}\n")
    return {"args": args, "model": model, "tokenizer": args.tokenizer, "load": str(load)}


@torch.no_grad()
def hand_logprobs(model, tokens, prefix_len=0):
    """log p(next token) at each position of ``tokens`` fed as one unpadded sequence; with
    ``prefix_len`` the first tokens attend to each other bidirectionally (prefix-LM)."""
    from megatron.model.masks import attention_structure
    t = torch.tensor([tokens])
    structure = None
    if prefix_len:
        structure = attention_structure(is_prefix=torch.arange(len(tokens))[None] < prefix_len)
    logits = model(t, torch.arange(len(tokens))[None], None, packed_seq_params=structure)
    return torch.log_softmax(logits[0].double(), dim=-1)


def hand_score(model, ctx, cont, prefix_lm=False):
    """Sum of log p(cont[j] | ctx, cont[:j]), the last token never fed."""
    whole = list(ctx) + list(cont)
    lp = hand_logprobs(model, whole[:-1], prefix_len=len(ctx) if prefix_lm else 0)
    return float(sum(lp[len(ctx) - 1 + j, tok] for j, tok in enumerate(cont)))


def instances(kind, args_list):
    from lm_eval.api.instance import Instance
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args_list]


def make_lm(tiny, **kw):
    from tasks.eval_harness.lm import MegatronLM
    return MegatronLM(tiny["model"], tiny["tokenizer"], SEQ, **kw)


def greedy_loop(model, tokenizer, ctx, steps):
    """Argmax over the real vocabulary, one full forward per token, stopping at end-of-document."""
    tokens, out = list(ctx), []
    for _ in range(steps):
        lp = hand_logprobs(model, tokens)
        nxt = int(lp[-1, :tokenizer.vocab_size].argmax())
        if nxt == tokenizer.eod:
            break
        out.append(nxt)
        tokens.append(nxt)
    return out


# ------------------------------------------------------------------ zero-shot choice_scores
def test_zero_shot_output_json_has_choice_scores_per_example(tiny, tmp_path):
    from tasks import zero_shot_rank_classification as rank
    data = tmp_path / "rank.jsonl"
    records = [{"task": "t", "inputs": d["question"], "choices": [" " + c for c in d["choices"]],
                "label": d["label"]} for d in MC_DOCS[:3]]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "rank.json"
    rank.main(MODEL + ["--load", tiny["load"], "--task-data", str(data), "--output-json", str(out),
                       "--eval-batch-size", "3"])
    written = json.loads(out.read_text())
    tok = tiny["tokenizer"]
    assert [len(s) for s in written["choice_scores"]] == [len(r["choices"]) for r in records]
    for record, scores, pred in zip(records, written["choice_scores"], written["predictions"], strict=True):
        expected = [hand_score(tiny["model"], tok.tokenize(record["inputs"]), tok.tokenize(c))
                    for c in record["choices"]]
        assert scores == pytest.approx(expected, abs=1e-5)
        assert pred == max(range(len(expected)), key=expected.__getitem__)
    correct = sum(p == r["label"] for p, r in zip(written["predictions"], records, strict=True))
    assert written["tasks"]["t"]["accuracy"] == correct / len(records)


# ------------------------------------------------------------------ the LM, request by request
def test_loglikelihood_equals_hand_computation_batched_and_truncated(tiny):
    tok, model = tiny["tokenizer"], tiny["model"]
    long_ctx = "A context much longer than the sequence length of thirty-two tokens: "
    requests = [("Is fire hot?", " yes"), ("2 + 2 =", " 4"), ("", "Hello there"),
                (long_ctx, " ok"), ("abc", " a longer continuation"), ("x", "y")]
    lm = make_lm(tiny, batch_size=4)  # two forwards, padded rows of different lengths
    got = lm.loglikelihood(instances("loglikelihood", requests))
    for (ctx, cont), (score, _) in zip(requests, got, strict=True):
        spaces = len(ctx) - len(ctx.rstrip())  # lm-eval moves them into the continuation
        ctx, cont = ctx[:len(ctx) - spaces], ctx[len(ctx) - spaces:] + cont
        ctx_ids = tok.tokenize(ctx) if ctx else [tok.eod]
        cont_ids = tok.tokenize(cont)
        whole = (ctx_ids + cont_ids)[-(SEQ + 1):]  # lm-eval's left truncation
        assert score == pytest.approx(
            hand_score(model, whole[:len(whole) - len(cont_ids)], cont_ids), abs=1e-5), ctx
    assert len(tok.tokenize(long_ctx)) > SEQ


def test_is_greedy_true_exactly_for_the_greedy_continuation(tiny):
    tok = tiny["tokenizer"]
    ctx = tok.tokenize("Cats say")
    greedy = greedy_loop(tiny["model"], tok, ctx, 3)
    assert len(greedy) == 3
    other = list(greedy)
    other[-1] = (other[-1] + 1) % 256
    lm = make_lm(tiny)
    results = lm._loglikelihood_tokens([(None, ctx, greedy), (None, ctx, other)])
    assert [g for _, g in results] == [True, False]


def test_prefix_lm_scores_with_the_context_as_prefix(tiny):
    tok, model = tiny["tokenizer"], tiny["model"]
    requests = [("Opposite of up:", " down"), ("Ice is", " cold")]
    prefix = make_lm(tiny, prefix_lm=True).loglikelihood(instances("loglikelihood", requests))
    causal = make_lm(tiny).loglikelihood(instances("loglikelihood", requests))
    for (ctx, cont), (p, _), (c, _) in zip(requests, prefix, causal, strict=True):
        ctx_ids, cont_ids = tok.tokenize(ctx), tok.tokenize(cont)
        assert p == pytest.approx(hand_score(model, ctx_ids, cont_ids, prefix_lm=True), abs=1e-5)
        assert abs(p - c) > 1e-3  # the prefix structure really changes the score


def test_rolling_loglikelihood_is_the_sum_over_lm_eval_windows(tiny):
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    tok, model = tiny["tokenizer"], tiny["model"]
    texts = [d["text"] for d in PPL_DOCS]
    got = make_lm(tiny, batch_size=3).loglikelihood_rolling(
        instances("loglikelihood_rolling", [(t,) for t in texts]))
    for text, score in zip(texts, got, strict=True):
        windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
            tok.tokenize(text), prefix_token=tok.eod, max_seq_len=SEQ, context_len=1)]
        assert sum(len(cont) for _, cont in windows) == len(tok.tokenize(text))
        expected = sum(hand_score(model, ctx, cont) for ctx, cont in windows)
        assert score == pytest.approx(expected, abs=1e-5)
    first_windows = list(get_rolling_token_windows(tok.tokenize(texts[0]), tok.eod, SEQ, 1))
    assert len(first_windows) >= 3


def test_greedy_generation_equals_an_argmax_loop_and_stops(tiny):
    tok, model = tiny["tokenizer"], tiny["model"]
    contexts = ["Cats say", "The quick brown fox"]
    lm = make_lm(tiny, batch_size=2, max_gen_toks=8)
    got = lm.generate_until(instances("generate_until", [(c, {"until": []}) for c in contexts]))
    loops = [greedy_loop(model, tok, tok.tokenize(c), 8) for c in contexts]
    assert got == [tok.detokenize(g) for g in loops]
    # a stop string (an ASCII token the loop produced after the first) cuts the text before it
    g = loops[0]
    k = next(i for i in range(1, len(g)) if g[i] < 128 and g[i] not in g[:i])
    stop = tok.detokenize([g[k]])
    got = lm.generate_until(instances("generate_until", [(contexts[0], {"until": [stop]}),
                                                         (contexts[0], {"max_gen_toks": 2})]))
    assert got == [tok.detokenize(g[:k]), tok.detokenize(g[:2])]
    with pytest.raises(Exception, match="greedily only"):
        lm.generate_until(instances("generate_until", [("x", {"do_sample": True})]))


def test_hf_tokenizer_scores_and_generates_like_the_hand_computation(tiny, hf_tokenizer_dir):
    """Another tokenizer type: the continuation's tokens are lm-eval's (context + continuation
    encoded, the context's tokens removed), greedy text is the tokenizer's decoding."""
    from tasks.checkpoint_model import build_model
    from tasks.eval_harness import evaluate
    from tasks.eval_harness.lm import MegatronLM
    args = evaluate.parse_eval_args(MODEL + ["--tasks", "unused", "--tokenizer-type",
                                             "HuggingFaceTokenizer", "--tokenizer-model",
                                             hf_tokenizer_dir])
    model, tok = build_model(args), args.tokenizer
    lm = MegatronLM(model, tok, SEQ, batch_size=2, max_gen_toks=5)
    requests = [("The weather today", " is sunny"), ("Numbers:", " one two three")]
    got = lm.loglikelihood(instances("loglikelihood", requests))
    for (ctx, cont), (score, _) in zip(requests, got, strict=True):
        ctx_ids = tok.tokenize(ctx)
        cont_ids = tok.tokenize(ctx + cont)[len(ctx_ids):]
        assert score == pytest.approx(hand_score(model, ctx_ids, cont_ids), abs=1e-5)
    text = lm.generate_until(instances("generate_until", [("The weather today", {})]))
    assert text == [tok.detokenize(greedy_loop(model, tok, tok.tokenize("The weather today"), 5))]


def test_load_iteration_selects_the_checkpoint(tiny):
    from tasks.eval_harness import evaluate
    args = evaluate.parse_eval_args(MODEL + ["--tasks", "unused", "--load", tiny["load"],
                                             "--load-iteration", str(ITERATION - 1)])
    model = evaluate.load_model(args)
    name, ref = next((n, p) for n, p in tiny["model"].named_parameters() if p.dim() == 2)
    assert torch.allclose(dict(model.named_parameters())[name], ref + 0.05)


def test_checkpoint_of_another_layout_loads_with_its_recorded_flags(tiny, tmp_path):
    """A TP 2 x PP 2 checkpoint (vocabulary padded for TP 2) evaluates with the full TP=1/PP=1
    weights and, with --use-checkpoint-args, the model flags it recorded."""
    from megatron.checkpoint.writer import write_checkpoint
    from megatron.config.checkpoint_args import model_args_from_args
    from tasks.eval_harness import evaluate
    tensors = {n: p.detach().clone() for n, p in tiny["model"].named_parameters()}
    emb = tensors["embedding.word_embeddings.weight"]
    tensors["embedding.word_embeddings.weight"] = torch.cat([emb, 0.1 * torch.randn(128, 64)])
    record = model_args_from_args(tiny["args"])
    record["padded_vocab_size"] = 512  # 258 tokens padded to a multiple of 128 x TP 2
    write_checkpoint(str(tmp_path / "tp2pp2"), tensors, record, tp=2, pp=2, iteration=5)
    args = evaluate.parse_eval_args(["--use-checkpoint-args", "--load", str(tmp_path / "tp2pp2"),
                                     "--tasks", "unused"])
    model = evaluate.load_model(args)
    assert (args.num_layers, args.hidden_size, args.seq_length) == (2, 64, SEQ)
    assert args.padded_vocab_size == 512
    loaded = dict(model.named_parameters())
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())


# ------------------------------------------------------------------ simple_evaluate, end to end
def test_simple_evaluate_on_local_tasks_matches_hand_scores(tiny, tmp_path):
    from tasks.eval_harness import evaluate
    mc, include = task_files(tmp_path)
    tok, model = tiny["tokenizer"], tiny["model"]
    # generation: the answer of the first document is the greedy text (cut at "\n\n"), of the
    # second not: exact_match 0.5 with the task's until and max_gen_toks
    greedy = tok.detokenize(greedy_loop(model, tok, tok.tokenize("Cats say"), 6)).split("\n\n")[0]
    gen_docs = [{"q": "Cats say", "answer": greedy}, {"q": "Ice is", "answer": greedy + "?"}]
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in gen_docs))
    (tmp_path / "include" / "tiny_gen.yaml").write_text(
        "task: tiny_gen\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files: {{test: {tmp_path / 'gen.jsonl'}}}\n"
        f"  cache_dir: {tmp_path / 'hf_cache'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: '{{q}}'\n"
        "doc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: [\"\\n\\n\"]\n"
        "  max_gen_toks: 6\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n")
    out = tmp_path / "results" / "lm_eval.json"
    evaluate.main(MODEL + ["--load", tiny["load"], "--tasks", f"{mc},tiny_ppl,tiny_gen",
                           "--include-path", include, "--results-path", str(out),
                           "--bootstrap-iters", "0", "--eval-batch-size", "4", "--log-samples"])
    results = json.loads(out.read_text())["results"]
    assert results["tiny_gen"]["exact_match,none"] == 0.5
    samples = [json.loads(line) for line in
               (tmp_path / "results" / "lm_eval_samples_tiny_mc.jsonl").read_text().splitlines()]
    assert [s["doc_id"] for s in samples] == list(range(len(MC_DOCS)))
    for s in samples:  # per-document responses: each choice's log-likelihood
        d = MC_DOCS[s["doc_id"]]
        assert [float(r[0]) for r in s["filtered_resps"]] == pytest.approx(
            [hand_score(model, tok.tokenize(d["question"]), tok.tokenize(" " + c))
             for c in d["choices"]], abs=1e-5)
    # multiple choice: context = question, continuation = " " + choice (lm-eval's delimiter)
    correct = 0
    for d in MC_DOCS:
        scores = [hand_score(model, tok.tokenize(d["question"]), tok.tokenize(" " + c))
                  for c in d["choices"]]
        correct += max(range(len(scores)), key=scores.__getitem__) == d["label"]
    assert results["tiny_mc"]["acc,none"] == pytest.approx(correct / len(MC_DOCS), abs=1e-12)
    # perplexities from the rolling log-likelihoods (lm-eval's weighted means)
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    total_ll, words, nbytes = 0.0, 0, 0
    for d in PPL_DOCS:
        windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
            tok.tokenize(d["text"]), tok.eod, SEQ, 1)]
        total_ll += sum(hand_score(model, c, t) for c, t in windows)
        words += len(re.split(r"\s+", d["text"]))
        nbytes += len(d["text"].encode("utf-8"))
    ppl = results["tiny_ppl"]
    assert ppl["word_perplexity,none"] == pytest.approx(math.exp(-total_ll / words), rel=1e-5)
    assert ppl["byte_perplexity,none"] == pytest.approx(math.exp(-total_ll / nbytes), rel=1e-5)
    assert ppl["bits_per_byte,none"] == pytest.approx(-total_ll / nbytes / math.log(2), rel=1e-5)


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("case, extra, message", [pytest.param(*case, id=case[0]) for case in [
    ("missing-checkpoint", ["--load", "{tmp}/nope", "--tasks", "{mc}"],
     r"--load .*nope: no such checkpoint directory"),
    ("missing-iteration", ["--load", "{load}", "--load-iteration", "9", "--tasks", "{mc}"],
     r"--load-iteration 9: .*iter_0000009 does not exist \(--load .* has "
     r"iter_0000002, iter_0000003\)"),
    ("no-load", ["--tasks", "{mc}"], r"--load is required"),
    ("unknown-task-file", ["--load", "{load}", "--tasks", "{tmp}/nope.yaml"],
     r"--tasks .*nope\.yaml: no such task file"),
    ("not-a-task-file", ["--load", "{load}", "--tasks", "{tmp}/bad.yaml"],
     r"--tasks .*bad\.yaml: not an lm-eval task file"),
    ("unknown-task-name", ["--load", "{load}", "--tasks", "tiny_nope", "--include-path", "{inc}"],
     r"--tasks tiny_nope: neither a task YAML file nor a task defined under --include-path "
     r"\(.*include\); known names: tiny_ppl"),
    ("missing-include-path", ["--load", "{load}", "--tasks", "{mc}", "--include-path",
                              "{tmp}/nodir"], r"--include-path .*nodir: no such directory"),
    ("log-samples-without-results-path", ["--load", "{load}", "--tasks", "{mc}",
                                          "--log-samples"],
     r"--log-samples writes beside --results-path; give --results-path FILE"),
    ("more-layers-than-checkpoint", ["--num-layers", "3", "--load", "{load}", "--tasks", "{mc}"],
     r"--load .*does not fit the model flags .*lacks \['decoder\.layers\.2\."),
    ("other-hidden-size", ["--hidden-size", "32", "--load", "{load}", "--tasks", "{mc}"],
     r"--load .*does not fit the model flags \(--hidden-size, --num-attention-heads, "
     r"--ffn-hidden-size, \.\.\.\): "
     r"\d+ weights differ in shape, e\.g\. embedding\.word_embeddings\.weight: checkpoint "
     r"\[384, 64\], model \[384, 32\]"),
]])
def test_bad_input_is_one_clear_error(tiny, tmp_path, case, extra, message):
    from megatron.errors import ConfigError
    from tasks.eval_harness import evaluate
    mc, include = task_files(tmp_path)
    (tmp_path / "bad.yaml").write_text("dataset_path: json\n")
    fill = dict(tmp=tmp_path, mc=mc, load=tiny["load"], inc=include)
    with pytest.raises(ConfigError, match=message):
        evaluate.main(MODEL + [a.format(**fill) for a in extra])


@pytest.mark.parametrize("flag, value", [("--limit", "0"), ("--eval-batch-size", "0"),
                                         ("--num-fewshot", "-1"), ("--max-gen-toks", "0")])
def test_bad_flag_value_exits_2_naming_it(capsys, flag, value):
    from tasks.eval_harness import evaluate
    with pytest.raises(SystemExit) as e:
        evaluate.parse_eval_args(MODEL + ["--tasks", "t", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}: {value}" in capsys.readouterr().err


def test_entry_point_prints_one_error_line(tiny, tmp_path, capsys, monkeypatch):
    """What ``python tasks/eval_harness/evaluate.py`` does with a bad input (run_entry_point):
    one ``error:`` line on stderr, exit status 1, no traceback."""
    from megatron.runtime.process_exit import run_entry_point
    from tasks.eval_harness import evaluate
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = MODEL + ["--load", str(tmp_path / "nope"), "--tasks", str(tmp_path / "nope.yaml")]
    with pytest.raises(SystemExit) as e:
        run_entry_point(lambda: evaluate.main(argv))
    assert e.value.code == 1
    expected = f"error: --tasks {tmp_path / 'nope.yaml'}: no such task file\n"
    assert capsys.readouterr().err == expected
