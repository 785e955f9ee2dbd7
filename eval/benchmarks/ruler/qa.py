"""Question answering (``qa_1`` SQuAD, ``qa_2`` HotpotQA): the gold documents among distractors.

Sample ``i`` asks the ``i``-th answerable question, as RULER does; the seed changes the distractor
documents and their order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from restkv.eval.benchmarks.ruler.fitting import Build, Draft
from restkv.eval.benchmarks.ruler.plan import Job, Plan
from restkv.eval.benchmarks.ruler.qa_data import QAData, load_qa
from restkv.eval.benchmarks.ruler.templates import DOCUMENT_TEMPLATE, FAMILIES, split_template
from restkv.eval.benchmarks.ruler.words import prefix_sample


@dataclass(frozen=True)
class QA:
    """A qa task's settings."""

    dataset: str  # "squad" | "hotpotqa"
    family: str = "qa"

    def plan(self, job: Job) -> Plan:
        """Documents (official step 10; the official search sizes with question 0)."""
        qa = load_qa(self.dataset, job.data)

        def builder(index: int, seed: str) -> tuple[Build, int]:
            return qa_builder(qa, index, seed), len(qa.questions[index % len(qa.questions)].gold)

        return Plan(self.dataset, builder, n_max=4 * job.budget + 16, step=10, probe=10)


def qa_builder(qa: QAData, index: int, seed: str) -> Build:
    """``build(n)`` for question ``index``: its gold documents among ``n`` documents."""
    family = FAMILIES["qa"]
    head, tail = split_template(family.template)
    item = qa.questions[index % len(qa.questions)]
    total = len(qa.docs)
    excluded = set(item.gold) | set(item.related)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        related = list(item.related)
        rng.shuffle(related)
        if n >= total:
            chosen = (list(range(total)) * -(-n // total))[:n]
        elif n - len(item.gold) <= len(related):
            chosen = item.gold + related[: n - len(item.gold)]
        else:
            need = n - len(item.gold) - len(related)
            others = [d for d in prefix_sample(rng, range(total), need + len(excluded)) if d not in excluded]
            chosen = item.gold + related + others[:need]
        rng.shuffle(chosen)
        context = "\n\n".join(DOCUMENT_TEMPLATE.format(i=i + 1, document=qa.docs[d]) for i, d in enumerate(chosen))
        depths = sorted({chosen.index(g) / len(chosen) for g in item.gold if g in chosen})
        return Draft(
            context=head + context,
            question=tail.format(query=item.query),
            answer_prefix=family.answer_prefix,
            references=list(item.answers),
            depths=depths,
        )

    return build
