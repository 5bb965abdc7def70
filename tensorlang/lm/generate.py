"""The Generator: schedules from the tensor language model, legal by construction, in one pass.

    gen = Generator()                      # the shipped checkpoint (lm/checkpoints/default)
    out = gen.generate(space)              # one pass: out.point (sketch, decisions, .stmts, .mod), out.tokens
    out = gen.generate(space, num_beams=4) # beam search (the checkpoint's generation_config.json may ask for it)
    outs = gen.sample(space, k=8, seed=0)  # up to 8 distinct legal schedules (the one-pass one first, then
                                           # samples at SAMPLE_TEMPERATURE)
    out = gen.generate(space, constraints(space, written_stmts))  # consistent with what a user wrote

Decoding is constrained by the Space Builder: at every step a LogitsProcessor (`LegalTokens`) leaves only
the legal next tokens of `NextTokens` (everything else -inf), so no output is ever rejected or retried.
Tokens with one legal choice (forced: SKETCH, DECISIONS, the decision heads, ...) are fed together with the
next chosen token in one forward step; the prompt and the forced tokens after it are the prefill. KV cache on.
The forward pass is `lm/inference.GPT2Decoder` by default (the checkpoint's GPT2LMHeadModel computed in torch
alone with the same torch calls -- the same logits, bit for bit here -- without transformers' 2.5-5 s import); `engine="transformers"` runs GPT2LMHeadModel.
Greedy ties go to the lowest token id (torch.argmax over the legal ids in ascending order returns the
first maximum). Beam search (`num_beams` > 1) keeps the most likely prefixes and returns the most likely
whole schedule it finds, ties broken the same way. Same space and model -> the same tokens. With `constraints` (space/constraints.py: what a partly written
schedule fixes), the legal tokens are narrowed to them (`ConstrainedTokens`): the schedule keeps every
written decision, whatever the model would have chosen.
Decoding rules narrow the legal tokens further, each switched on by the checkpoint's generation_config.json
(lm/decoding_rules.py; a written decision still wins). The first (`guard`, on unless the checkpoint sets
`no_repeated_reductions` false): a reduction is never computed at a site that repeats its work when a site that
does not is legal (space/recompute.py). MetaSchedule's space offers such sites and its search discards them by
measuring; one pass cannot, and the model has picked them for softmax rows it was not trained on (GPT-2's
seq-1024 softmax: 7.8 s against roller's 82 ms). The others are heuristics read off measurements: the vector,
register and parallel tiles, the single-accumulator unroll and the partial sums.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tensorlang.lm.decoding_rules import RULES

# The temperature of `sample`'s candidates after the one-pass one (tlm:K, collect --model, generate --samples).
# benchmarks/tlm_sampling.py (the shipped model, 28 validation tasks, the 8 candidates of every temperature measured
# side by side): the fastest of 8 at 0.4 was 1.013x as fast as at 1.0 (13 wins, 8 losses; geomean), 0.7 and 0.2
# were 0.96-0.97x; two earlier runs of the same comparison gave 0.4 1.03x and 1.06x over 1.0. A small edge, but the
# same way in all three. ("Second choices" -- greedy with its least sure decisions flipped one at a time -- was
# tried once beside them: 0.99x of 1.0.)
SAMPLE_TEMPERATURE = 0.4
# How `sample` draws, for caches of its candidates (benchmarks/tlm.py, collect's model-candidates.done): the same
# seed gives other samples under another sampler. "tree v1": the samples decoded together as a tree of distinct
# prefixes (Generator._sample_tree), since 2026-12-08; one at a time before.
SAMPLER = "tree v1"


@dataclass
class Output:
    point: object  # space.Point: sketch, decisions, stmts, mod
    tokens: list  # the schedule part (SKETCH ... [EOS])
    steps: int = 0  # forward passes (prefill included)
    free: int = 0  # tokens the model chose
    forced: int = 0  # tokens fed without a choice
    seconds: dict = field(default_factory=dict)  # decode, finish
    logp: float | None = None  # beam search: the schedule's log-probability over its chosen tokens

    @property
    def schedule_text(self) -> str:
        from tensorlang.space.render import statements_text
        return statements_text(self.point.stmts)


_CACHE_ARG = "cache"  # transformers >= 5.2x; `past_key_values` before


def _cache(out):
    global _CACHE_ARG
    c = out.get("cache")
    if c is None:
        _CACHE_ARG = "past_key_values"
        c = out.get("past_key_values")
    return c


@dataclass
class _Node:
    """A prefix of the sampler's tree: its decoder state, the attempts that wrote it, and their counts so far."""
    nt: object
    attempts: list
    free: int
    forced: int
    steps: int  # forward passes


@dataclass
class _Beam:
    """A prefix of beam search: its log-probability, decoder state, KV cache and next-token logits."""
    score: float
    nt: object
    past: object
    logits: object
    free: int
    forced: int


def _legal_ids(nt) -> list[int]:
    """The legal next token ids, ascending; an error if there is none (a decoder state gone wrong)."""
    allowed = sorted(nt.allowed_ids())
    if not allowed:
        raise RuntimeError(f"no legal token after {nt.tokens[-8:]} ({getattr(nt, 'error', None)})")
    return allowed


class LegalTokens:
    """A `transformers.LogitsProcessor`: -inf on every token NextTokens does not allow."""

    def __init__(self, next_tokens):
        self.nt = next_tokens

    def allowed(self) -> list[int]:
        return sorted(self.nt.allowed_ids())

    def __call__(self, input_ids, scores):
        import torch
        allowed = torch.tensor(self.allowed(), dtype=torch.long, device=scores.device)
        out = torch.full_like(scores, float("-inf"))
        out[..., allowed] = scores[..., allowed]
        return out


def _logits_processor_base():
    from transformers import LogitsProcessor
    return LogitsProcessor


class _Threads:
    """torch's intra-op threads for the duration of a block (None: as they are), restored after."""

    def __init__(self, n):
        self.n, self.before = n, None

    def __enter__(self):
        import torch
        if self.n is not None and torch.get_num_threads() != self.n:
            self.before = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.before is not None:
            import torch
            torch.set_num_threads(self.before)
            self.before = None


ENGINES = ("torch", "transformers")


class Generator:
    """`engine`: "torch" (lm/inference.py, the default) or "transformers" (GPT2LMHeadModel), the same
    logits. `threads`: torch's threads while decoding on a CPU (default 1: a 1-row decode step gains nothing from a
    second thread, and on a busy 2-core machine two threads made it ~20x slower, 1.6 s instead of 80 ms per
    schedule, measured); None leaves the caller's setting."""

    def __init__(self, path: str | Path | None = None, device: str | None = None, threads: int | None = 1,
                 engine: str = "torch"):
        import torch

        from tensorlang.lm import model as M
        from tensorlang.space import sentence as S
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.threads = threads if self.device == "cpu" else None
        self.engine = engine
        self.path = Path(path or M.DEFAULT_DIR)
        t0 = time.perf_counter()
        if engine == "torch":
            from tensorlang.lm.inference import GPT2Decoder
            self.model, self.card = GPT2Decoder.from_pretrained(self.path, self.device), M.read_card(self.path)
        else:
            self.model, self.card = M.load(self.path, self.device)
            # make LegalTokens a real LogitsProcessor subclass (transformers imported by now)
            global LegalTokens
            if not issubclass(LegalTokens, _logits_processor_base()):
                LegalTokens = type("LegalTokens", (LegalTokens, _logits_processor_base()), {})
        self.load_s = time.perf_counter() - t0
        M.check_sentences(self.card, self.path)
        self.words = S.vocabulary()
        self.ids = S.token_ids()
        self.quality = self.card.get("generation_quality_token")
        self.num_beams = M.generation_beams(self.path)  # the checkpoint's decoding: 1 = greedy
        # the decoding rules the checkpoint switches on (lm/decoding_rules.py): self.guard, self.vector_tile, ...
        for r in RULES:
            setattr(self, r.attr, M.generation_rule(self.path, r.attr))

    @property
    def name(self) -> str:
        from tensorlang.lm import model as M
        return M.version(self.card)

    def prompt(self, space) -> list[str]:
        from tensorlang.space import sentence as S
        return ([self.quality] if self.quality else []) + S.prompt_tokens(space)

    # ------------------------------------------------------------------ decoding
    def forward(self, ids: list[list[int]], past=None, attention_mask=None, position_ids=None):
        """(logits [batch, len, vocab], cache) of these rows after `past` (None: from the start). Rows of a
        batch may end in padding, which no real position reads; rows of different histories say which cached
        positions are real (`attention_mask`, [batch, cached + len]) and their own positions (`position_ids`)."""
        import torch
        input_ids = torch.tensor(ids, device=self.device)
        if self.engine == "torch":
            return self.model(input_ids, past, attention_mask, position_ids)
        kw = {_CACHE_ARG: past} if past is not None else {}
        if attention_mask is not None:
            kw.update(attention_mask=attention_mask.long(), position_ids=position_ids)
        elif past is not None and len(ids) > 1:  # a batched look-ahead: the mask says the cache is all real
            kw["attention_mask"] = torch.ones((len(ids), past.get_seq_length() + len(ids[0])), dtype=torch.long,
                                              device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, use_cache=True, **kw)
        return out.logits, _cache(out)

    def _start(self, space, constraints=None):
        """Prefill: the prompt plus the forced tokens after it. -> (NextTokens, past, logits, fed ids, stats)"""
        from tensorlang.space.sentence import NextTokens
        prefer = [r.preference() for r in RULES if getattr(self, r.attr)]
        if constraints is not None or prefer:
            from tensorlang.space.constraints import ConstrainedTokens, preferring
            nt = ConstrainedTokens(space, constraints, prefer=preferring(*prefer) if prefer else None)
        else:
            nt = NextTokens(space)
        fed = [self.ids[t] for t in self.prompt(space)]
        forced = self._push_forced(nt)
        fed += [self.ids[t] for t in forced]
        logits, past = self.forward([fed])
        return nt, past, logits[0, -1], fed, len(forced)

    @staticmethod
    def _push_forced(nt) -> list[str]:
        from tensorlang.space.sentence import push_forced
        return push_forced(nt)

    def _decode(self, nt, past, logits) -> tuple[list, int, int, int]:
        """Greedy decoding from a decoder state: each step's value chosen by `_greedy` (one token, or a whole
        spelled number) and fed with the forced tokens after it."""
        free = forced_n = steps = 0
        while not nt.done:
            allowed = _legal_ids(nt)
            chosen = self._greedy(nt, past, logits, allowed)
            for tok in chosen:
                nt.push(self.words[tok])
            free += len(chosen)
            forced = self._push_forced(nt)
            forced_n += len(forced)
            if nt.done:
                break
            logits, past = self.forward([chosen + [self.ids[t] for t in forced]], past)
            logits = logits[0, -1]
            steps += 1
        return nt.tokens, free, forced_n, steps

    @staticmethod
    def _argmax(logits, allowed: list[int]) -> int:
        import torch
        idx = torch.tensor(allowed, device=logits.device)
        return allowed[int(torch.argmax(logits[idx].float()))]  # first maximum: the lowest id among ties

    def _greedy(self, nt, past, logits, allowed: list[int]) -> list[int]:
        """The most likely legal value. A value is one token, or an integer outside the vocabulary spelled
        `NUM> s digits <NUM`: that one is scored by its whole spelling -- the probability of `NUM>` alone is
        that of every spelled value together, and taken token by token it wins where one of them would not
        (0.72 for `NUM>` against 0.27 for 256 in LLaMA's 11008-wide matmul gave [1, 1, 11008, 1])."""
        num = self.ids["NUM>"]
        if num not in allowed or len(allowed) == 1:
            return [self._argmax(logits, allowed)]
        import torch
        idx = torch.tensor(allowed, device=logits.device)
        logp = torch.log_softmax(logits[idx].float(), dim=-1)
        best_tok = self._argmax(logits, [a for a in allowed if a != num])
        best = [(float(logp[allowed.index(best_tok)]), [best_tok])]
        spelled = _spellings(nt, self.words[num])
        if spelled:
            scores = self._spelled_logp([[self.ids[t] for t in seq] for seq in spelled], past)
            base = float(logp[allowed.index(num)])
            best += [(base + sc, [self.ids[t] for t in seq]) for sc, seq in zip(scores, spelled)]
        top = max(b[0] for b in best)
        return min(ids for score, ids in best if score == top)  # ties: the lowest ids

    def _spelled_logp(self, seqs: list[list[int]], past) -> list[float]:
        """log P(rest of each spelling | NUM>) under the legal-token renormalisation, in one batched step
        (the legal set at each position is the spellings' next tokens there: a trie)."""
        import copy

        import torch
        longest = max(len(s) for s in seqs)
        pad = self.ids["[PAD]"]
        cache = copy.deepcopy(past)
        cache.batch_repeat_interleave(len(seqs))
        # padding is at the end and never read: every position attends to all before it
        logits, _ = self.forward([(s + [pad] * (longest - len(s)))[:-1] for s in seqs], cache)
        logits = logits.float()
        scores = []
        for b, s in enumerate(seqs):
            total = 0.0
            for pos in range(1, len(s)):
                nxt = sorted({o[pos] for o in seqs if len(o) > pos and o[:pos] == s[:pos]})
                row = torch.log_softmax(logits[b, pos - 1, nxt], dim=-1)
                total += float(row[nxt.index(s[pos])])
            scores.append(total)
        return scores

    def generate(self, space, constraints=None, num_beams: int | None = None) -> Output:
        """The model's one-pass schedule for a space (its target is in the prompt), within `constraints` if
        given: greedy (`num_beams` 1) or beam search, as the checkpoint's generation_config.json says unless
        `num_beams` is given."""
        with _Threads(self.threads):
            return self._one_pass(space, constraints, num_beams)

    def _one_pass(self, space, constraints=None, num_beams: int | None = None) -> Output:
        n = self.num_beams if num_beams is None else num_beams
        if n > 1:
            return self._beam_search(space, n, constraints)
        return self._generate(space, constraints)

    def _generate(self, space, constraints=None) -> Output:
        t0 = time.perf_counter()
        nt, past, logits, _, forced0 = self._start(space, constraints)
        try:
            tokens, free, forced, steps = self._decode(nt, past, logits)
            t1 = time.perf_counter()
            point = nt.finish()
        finally:
            nt.close()
        t2 = time.perf_counter()
        return Output(point, list(tokens), steps + 1, free, forced + forced0,
                      {"decode": t1 - t0, "finish": t2 - t1})

    def _beam_search(self, space, num_beams: int, constraints=None) -> Output:
        """Beam search over the legal tokens: the `num_beams` most likely prefixes are kept at every step, scored
        by the sum of their chosen tokens' log-probabilities under the legal-token renormalisation (forced tokens
        add nothing: their probability is 1). A prefix less likely than a finished schedule is dropped (a score
        only falls), so the search ends when no prefix can still beat the best finished one. Greedy picks each
        token alone and can pair, say, a 16-wide inner tile of one loop with a 28-wide one of the next; the
        beams compare whole tilings. Ties: the earlier beam, then the lower token id -- deterministic."""
        import torch
        t0 = time.perf_counter()
        nt0, past0, logits0, _, forced0 = self._start(space, constraints)
        start = _Beam(0.0, nt0, past0, logits0, 0, forced0)
        live, finished = ([], [start]) if nt0.done else ([start], [])  # a one-point space: all forced
        steps = 1
        try:
            while live:
                cands = []
                for i, b in enumerate(live):
                    allowed = _legal_ids(b.nt)
                    idx = torch.tensor(allowed, device=b.logits.device)
                    logp = torch.log_softmax(b.logits[idx].float(), dim=-1).tolist()
                    best = sorted(zip(logp, allowed), key=lambda x: (-x[0], x[1]))[:num_beams]
                    cands += [(b.score + lp, i, tok) for lp, tok in best]
                cands.sort(key=lambda c: (-c[0], c[1], c[2]))
                bar = max((f.score for f in finished), default=float("-inf"))
                chosen = [c for c in cands if c[0] > bar][:num_beams]
                children, feeds = [], []
                for score, i, tok in chosen:
                    parent = live[i]
                    nt = parent.nt.fork()
                    nt.push(self.words[tok])
                    forced = self._push_forced(nt)
                    child = _Beam(score, nt, parent.past, None, parent.free + 1, parent.forced + len(forced))
                    if nt.done:
                        finished.append(child)
                        continue
                    children.append(child)
                    feeds.append([tok] + [self.ids[t] for t in forced])
                steps += self._step_beams(children, feeds)
                for b in live:
                    b.nt.close()
                live = children
            if not finished:
                raise RuntimeError("beam search finished no schedule")
            top = max(finished, key=lambda f: f.score)  # the first of equals: ties to the earlier-finished
            for f in finished:
                if f is not top:
                    f.nt.close()
            t1 = time.perf_counter()
            try:
                point = top.nt.finish()
            finally:
                top.nt.close()
        finally:
            for b in live:
                b.nt.close()
        return Output(point, list(top.nt.tokens), steps, top.free, top.forced,
                      {"decode": t1 - t0, "finish": time.perf_counter() - t1}, logp=top.score)

    def _step_beams(self, beams: list, feeds: list) -> int:
        """One forward step of every beam on its own cache (beam.past -> beam.past, beam.logits). With the torch
        engine, beams whose caches and feeds have the same lengths (the usual case: one sketch, the same forced
        tokens) go in one batched step -- their caches stacked, the result split back into views. -> forward
        passes run."""
        import copy

        import torch
        if self.engine != "torch":  # transformers' caches are extended in place: each beam its own copy
            for b, ids in zip(beams, feeds):
                logits, b.past = self.forward([ids], copy.deepcopy(b.past))
                b.logits = logits[0, -1]
            return len(beams)
        from tensorlang.lm.inference import KVCache
        groups: dict = {}
        for b, ids in zip(beams, feeds):
            groups.setdefault((b.past.get_seq_length(), len(ids)), []).append((b, ids))
        for group in groups.values():
            if len(group) == 1:
                b, ids = group[0]
                logits, b.past = self.forward([ids], b.past)
                b.logits = logits[0, -1]
                continue
            caches = [b.past for b, _ in group]
            stacked = KVCache([(torch.cat([c.layers[i][0] for c in caches]), torch.cat([c.layers[i][1] for c in caches]))
                               for i in range(len(caches[0].layers))])
            logits, past = self.forward([ids for _, ids in group], stacked)
            for row, (b, _) in enumerate(group):
                b.past = KVCache([(k[row:row + 1], v[row:row + 1]) for k, v in past.layers])
                b.logits = logits[row, -1]
        return len(groups)

    def sample(self, space, k: int, seed: int = 0, temperature: float = SAMPLE_TEMPERATURE,
               attempts: int | None = None, constraints=None, num_beams: int | None = None) -> list[Output]:
        """Up to k distinct legal schedules: the one-pass one (`generate`'s), then seeded samples at `temperature`
        (as many as the space holds within `attempts`, default 4k + 4), all within `constraints` if given. The
        samples are decoded side by side, sharing their common prefixes (`_sample_tree`); the first k of them
        are those of `sample(k + 1)`."""
        with _Threads(self.threads):
            return self._sample(space, k, seed, temperature, attempts, constraints, num_beams)

    def _sample(self, space, k, seed, temperature, attempts, constraints=None, num_beams=None) -> list[Output]:
        from tensorlang.space.space import Infeasible
        outs = [self._one_pass(space, constraints, num_beams)]
        seen = {(outs[0].point.sketch, tuple(outs[0].point.decisions))}
        if k <= 1:
            return outs[:k]
        budget = attempts if attempts is not None else 4 * k + 4
        nt0, past0, logits0, _, forced0 = self._start(space, constraints)
        tried = 0
        try:
            while len(outs) < k and tried < budget and not nt0.done:  # done: every token forced, one schedule
                n = min(budget - tried, k - len(outs))  # as many attempts as schedules are missing, side by side
                t0 = time.perf_counter()
                leaves = self._sample_tree(nt0, past0, logits0, range(tried, tried + n), seed, temperature)
                tried += n
                share = (time.perf_counter() - t0) / max(1, len(leaves))  # a schedule's share of the round
                for nt, free, forced, steps in leaves:
                    try:
                        key = (nt.sketch, tuple(nt.decisions))
                        if key in seen or len(outs) >= k:
                            continue
                        seen.add(key)
                        t1 = time.perf_counter()
                        try:
                            point = nt.finish()
                        except Infeasible:
                            # Where the postprocessors alone decide (a GPU sketch without a model of its limits:
                            # Space.refusal_free) a sample can be refused: it costs an attempt, not the others.
                            continue
                    finally:
                        nt.close()
                    outs.append(Output(point, list(nt.tokens), steps + 1, free, forced + forced0,
                                       {"decode": share, "finish": time.perf_counter() - t1}))
        finally:
            nt0.close()
        return outs

    def _sample_tree(self, nt0, past0, logits0, attempts: range, seed: int, temperature: float) -> list[tuple]:
        """One sample per attempt from the decoder state after the prefill (`nt0`, its cache and logits), decoded
        together as a tree of distinct prefixes: a node holds the attempts that have written the same tokens so
        far, and each of them draws its next token from the node's legal-token distribution at `temperature`
        with its own random stream (seeded by `seed` and the attempt's number, so an attempt draws the same
        sample in any round and batch: `sample(k)`'s schedules are the first of `sample(k + 1)`'s); one child
        per distinct token. Every node still writing takes one row of one forward pass a step (its chosen
        token and the forced ones after it, as one-pass decoding feeds them; shorter feeds padded, the padding
        masked): the weights are read once a step for all, and a prefix the attempts share is computed once --
        a confident model's samples share most of theirs, and one sample at a time, a 4x256's decoding was
        bound by reading its weights. A spelled value is drawn token by token (exact sampling).
        -> [(decoder state, free, forced, steps)]: one per distinct sample, by its first attempt; the caller
        closes them."""
        import bisect
        import copy
        import random

        import torch
        streams = {a: random.Random(f"{seed}:{a}") for a in attempts}
        nodes = [_Node(nt0.fork(), list(attempts), 0, 0, 0)]
        logits = [logits0]
        cache = copy.deepcopy(past0)
        real = torch.ones((1, past0.get_seq_length()), dtype=torch.bool, device=self.device)
        pad = self.ids["[PAD]"]
        leaves = []
        try:
            while nodes:
                children, parents, feeds = [], [], []
                for r, node in enumerate(nodes):
                    allowed = _legal_ids(node.nt)
                    idx = torch.tensor(allowed, device=logits[r].device)
                    cdf = torch.softmax(logits[r][idx].double().cpu() / temperature, dim=-1).cumsum(0).tolist()
                    drawn = {}
                    for a in node.attempts:
                        i = min(bisect.bisect_right(cdf, streams[a].random() * cdf[-1]), len(cdf) - 1)
                        drawn.setdefault(i, []).append(a)
                    picks = sorted(drawn)
                    states = [node.nt] + [node.nt.fork() for _ in picks[1:]]  # forked before the parent moves on
                    for i, state in zip(picks, states):
                        tok = allowed[i]
                        state.push(self.words[tok])
                        forced = self._push_forced(state)
                        child = _Node(state, drawn[i], node.free + 1, node.forced + len(forced), node.steps)
                        if state.done:
                            leaves.append(child)
                        else:
                            children.append(child)
                            parents.append(r)
                            feeds.append([tok] + [self.ids[t] for t in forced])
                nodes = children
                if not nodes:
                    break
                index = torch.tensor(parents, device=self.device)  # each child's row: its parent's, repeated
                cache.batch_select_indices(index)
                real = real[index]
                width = max(len(f) for f in feeds)
                filled = real.sum(dim=1).tolist()  # each row's real positions so far
                ids = [f + [pad] * (width - len(f)) for f in feeds]
                # a padded position's own position id repeats the row's last (it is never attended to)
                position_ids = torch.tensor([[filled[r] + min(j, len(f) - 1) for j in range(width)]
                                             for r, f in enumerate(feeds)], device=self.device)
                new = torch.tensor([[j < len(f) for j in range(width)] for f in feeds], device=self.device)
                real = torch.cat([real, new], dim=1)
                out, cache = self.forward(ids, cache, real, position_ids)
                logits = [out[r, len(f) - 1] for r, f in enumerate(feeds)]
                for node in nodes:
                    node.steps += 1
        except BaseException:
            for node in nodes + leaves:
                node.nt.close()
            raise
        leaves.sort(key=lambda node: node.attempts[0])
        return [(node.nt, node.free, node.forced, node.steps) for node in leaves]


def _spellings(nt, start: str) -> list[list[str]]:
    """Every legal token sequence from `start` (NUM>) to the end of its number (<NUM), by forks of the
    decoder state (nothing is pushed to `nt`)."""
    out = []

    def walk(state, seq):
        for tok in sorted(state.allowed()):
            if tok == "<NUM":  # not pushed: completing a decision could start a replay
                out.append(seq + [tok])
                continue
            child = state.fork()
            try:
                child.push(tok)
                walk(child, seq + [tok])
            finally:
                child.close()

    first = nt.fork()
    try:
        first.push(start)
        walk(first, [start])
    finally:
        first.close()
    return out


_DEFAULT: dict = {}


def default_generator(path: str | Path | None = None) -> Generator:
    """One Generator per checkpoint per process (loaded on first use)."""
    from tensorlang.lm import model as M
    key = str(Path(path or M.DEFAULT_DIR).resolve())
    if key not in _DEFAULT:
        _DEFAULT[key] = Generator(key)
    return _DEFAULT[key]


def fastest(outputs: list[Output], op, target, repeat: int = 5, timeout_s: float = 30.0):
    """Measure candidates with the bench harness; (best output, results). Only correct, timed ones count."""
    from tensorlang.bench.harness import OK, Candidate, measure_candidates
    cands = [Candidate(f"tlm#{i}", op, target, o.schedule_text) for i, o in enumerate(outputs)]
    results = measure_candidates(cands, repeat=repeat, timeout_s=timeout_s)
    timed = [(r.median_s, i) for i, r in enumerate(results) if r.status == OK and r.median_s]
    if not timed:
        return None, results
    return outputs[min(timed)[1]], results
