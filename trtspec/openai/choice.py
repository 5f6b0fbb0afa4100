"""One choice of a request as its Triton responses arrive (`Choice`: its text with stop sequences
trimmed, its log-probabilities, reasoning and tool calls apart, its token counts and speculative
figures), and what a response reports of its choices (`usage_of`, `figures_of`)."""

from __future__ import annotations

from collections.abc import Callable

from trtspec.openai.logprobs import LogprobsBody
from trtspec.openai.protocol import stop_list
from trtspec.openai.reasoning import ReasoningParser
from trtspec.openai.stops import StopTrimmer
from trtspec.openai.tools import ToolParser, ToolPlan
from trtspec.openai.triton_stream import Generation
from trtspec.triton.request import context_of, produced_chars


class Choice:
    """One choice's figures while its steps arrive."""

    def __init__(self, gen: Generation, prompt_ids: list[int], sample: int = 0,
                 logprobs: LogprobsBody | None = None, echo: str | None = None,
                 decode: Callable[[list[int]], str] | None = None, include: tuple[str, ...] = (),
                 tools: ToolPlan | None = None, start: str | None = None, show_reasoning: bool = True):
        self.gen, self.prompt_ids, self.prompt_tokens = gen, prompt_ids, len(prompt_ids)
        self.sample = sample  # j of the prompt's n choices
        self.trimmer = StopTrimmer(stop_list(list(gen.stop_words)), protected=None if gen.min_tokens else 0,
                                   include=frozenset(include))  # stops kept in the text
        self.decode = decode  # the tokenizer's: where the first min_tokens tokens' text ends
        self.context = () if decode is None else context_of(decode, prompt_ids)  # decoded after
        self.ids: list[int] = []  # generated so far, while min_tokens has not been reached
        self.completion_tokens = self.accepted = self.drafted = self.forwards = self.cached = 0
        self.predicted = self.prediction_accepted = 0  # drafts from the prediction, and those accepted
        self.last_id: int | None = None
        self.finish: str | None = None  # the model's finish_reason, with its totals
        self.logprobs = logprobs  # None: the request asked for no log-probabilities
        self.scored: tuple[list, list, list, list] = ([], [], [], [])  # ids, log p, top ids, top log p
        self.echo = echo  # the prompt's text, owed before the first text (echo)
        if logprobs is not None:  # the completion's offsets count after the prompt (and echo's text)
            logprobs.follow(prompt_ids, echo)
        self.tools = None if tools is None else ToolParser(tools)  # the text as content and tool calls
        # the reasoning block apart from the content (None: no reasoning parser); shown unless asked not to
        self.reasoning = None if start is None else ReasoningParser(start)
        self.show_reasoning = show_reasoning
        self.reasoned = False  # some of the text was reasoning

    def take(self, step) -> str:
        self.completion_tokens += len(step.ids)
        if self.trimmer.protected is None:  # a stop sequence may end only past these tokens' text
            self.ids += step.ids
            if len(self.ids) >= self.gen.min_tokens:
                self.trimmer.protected = produced_chars(self.decode, self.ids[: self.gen.min_tokens],
                                                        self.context)
        if step.ids:
            self.last_id = step.ids[-1]
        self.accepted = max(self.accepted, step.accepted_tokens)
        self.drafted = max(self.drafted, step.draft_tokens)
        self.forwards = max(self.forwards, step.target_forwards)
        self.cached = max(self.cached, step.cached_tokens)
        self.predicted = max(self.predicted, step.prediction_tokens)
        self.prediction_accepted = max(self.prediction_accepted, step.accepted_prediction_tokens)
        self.finish = step.finish_reason or self.finish
        echo, self.echo = self.echo, None
        if self.logprobs is not None:
            if echo is not None:  # the prompt's tokens first; nothing scores its first
                self._score(self.prompt_ids, [None, *step.prompt_logprobs], [None, *step.prompt_top_ids],
                            [None, *step.prompt_top_logprobs])
            self._score(step.ids, step.logprobs, step.top_ids, step.top_logprobs)
        return (echo or "") + self.trimmer.push(step.text, final=step.final)

    def _score(self, *columns: list) -> None:
        for kept, new in zip(self.scored, columns, strict=True):
            kept += new

    def logprobs_body(self) -> dict | None:
        """The logprobs of the tokens taken since the last call (None: none asked for, or none new)."""
        if self.logprobs is None or not self.scored[0]:
            return None
        body = self.logprobs.body(*self.scored)
        self.scored = ([], [], [], [])
        return body

    def status(self) -> str:
        """The newer APIs' status of a finished choice: incomplete where its token limit ran out."""
        return "incomplete" if self.finish_reason() == "length" else "completed"

    def finish_reason(self) -> str:
        if self.trimmer.stopped:
            reason = "stop"  # a stop sequence
        elif self.finish is not None:  # the model's: an end id on the last allowed token is a stop
            reason = self.finish
        else:
            reason = "stop" if self.completion_tokens < self.gen.max_tokens else "length"
        return reason if self.tools is None else self.tools.finish_reason(reason)

    def deltas(self, text: str, final: bool) -> list[dict]:
        """A chat choice's new text as message deltas: reasoning, then content or tool calls found
        in the content."""
        out = []
        if self.reasoning is not None:
            reasoning, text = self.reasoning.push(text)
            if final:
                more, text_more = self.reasoning.finish()
                reasoning, text = reasoning + more, text + text_more
            self.reasoned = self.reasoned or bool(reasoning)
            if reasoning and self.show_reasoning:
                out.append({"reasoning_content": reasoning})
        if self.tools is None:
            return out + ([{"content": text}] if text else [])
        if text or self.reasoning is None:  # a named call starts with the content's first text
            out += self.tools.push(text)
        return out + (self.tools.finish() if final else [])

    def figures(self) -> dict:
        return {"accepted_tokens": self.accepted, "draft_tokens": self.drafted,
                "target_forwards": self.forwards, "cached_tokens": self.cached}


def usage_of(runs: list[Choice]) -> dict:
    """OpenAI's and vLLM's `usage`: each prompt counted once however many choices it has (`n`),
    every choice's generated tokens; `prompt_tokens_details.cached_tokens`: those of the prompts'
    tokens kept from an earlier request (prefix reuse), as OpenAI and vLLM report them."""
    prompt = sum(run.prompt_tokens for run in runs if run.sample == 0)
    cached = sum(run.cached for run in runs if run.sample == 0)
    completion = sum(run.completion_tokens for run in runs)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    if any(run.gen.prediction for run in runs):  # OpenAI's counts of the predicted output's tokens
        accepted = sum(run.prediction_accepted for run in runs)
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(run.predicted for run in runs) - accepted}
    return usage


def figures_of(runs: list[Choice], choice: int | None = None) -> dict:
    """The `trtspec` field: drafted and accepted tokens and target forwards of one choice (or all
    added up), and for a sampled request its seed (the one sent, or the one drawn for it): sent
    back as `seed`, it samples the same choices again (under Gumbel coupling exactly, under
    rejection sampling only when its draft lengths repeat too)."""
    figures = _summed(run.figures() for run in (runs if choice is None else [runs[choice]]))
    first = runs[0].gen  # choice j of a prompt samples with seed + j: the first's is the request's
    return figures if first.temperature == 0 else {**figures, "seed": first.seed}


def _summed(parts) -> dict:
    """Figures of several choices added up, key by key."""
    total: dict = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total
