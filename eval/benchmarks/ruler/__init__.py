"""RULER's 13 synthetic tasks, generated at any length in the model's tokens or read from official files.

RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?") builds every prompt for a target tokenizer and a target length. This package follows the
official generator (NVIDIA/RULER ``scripts/data``): its task list, haystacks, key and value types,
needle/value/query counts, prompt templates, answer prefixes, generation lengths and metrics, its word
source (``wonderwords``) and its length-fit rule; it re-implements the procedures and shares no code
with it. It also reads the files the official generator writes (:mod:`.files`), which is what the
paper ran on.

Modules, one job each: :mod:`.templates` (prompt text), :mod:`.words` (vocabularies),
:mod:`.haystacks` (essay and needle placement), :mod:`.fitting` (length fit), :mod:`.plan` (the
family interface), one module per task family (:mod:`.niah`, :mod:`.variable_tracking`,
:mod:`.common_words`, :mod:`.freq_words`, :mod:`.qa` with :mod:`.qa_data`), :mod:`.tasks` (the 13
task names), :mod:`.generator` (:func:`generate`), :mod:`.files` and :mod:`.benchmark`.

Context / question split
    RULER's prompt is ``template.format(context=..., query=...) + answer_prefix``. ``Sample.context``
    is everything up to the end of the haystack (the task preamble, and for ``vt``/``cwe`` the solved
    example that precedes it); ``Sample.question`` is the rest of the template from its separator on;
    ``Sample.answer_prefix`` is RULER's answer prefix. ``context + question + answer_prefix`` is
    exactly RULER's prompt.

Deliberate differences from the official generator (``fit=official``, ``words=wonderwords``):

* Each sample draws from its own ``random.Random`` seeded by ``(seed, task, index)`` (RULER: one
  stream for the whole file), so a sample does not depend on how many are generated; the official
  search draws its probe prompt from a seed of its own. Where RULER reshuffles with a fixed seed
  (needle order, word lists, documents), the sample's generator shuffles.
* Keys are distinct within a sample and distractor needles never reuse a real key (RULER leaves such
  collisions to chance). Keys draw adjective and noun independently, which equals RULER's draw from
  the sorted list of all pairs.
* ``vt``'s example gets 500 tokens as in RULER, its answer included (with ``fit=exact``, half the
  budget when that is smaller, so that ``vt`` fits under about 1k tokens).
* The official search's upper bound for ``cwe`` is ``int(2 * length / tokens_per_word)`` (RULER rounds
  before doubling); it only changes which sizes the bisection probes.
* Essay sentences: punkt when NLTK and its data are installed, else a rule-based splitter (the run's
  ``metrics.json`` says which ran), split once over the whole essay.
* Long ``cwe`` prompts need more words than ``wonderwords`` holds: RULER's ``english_words.json``
  when given (``bench.english_words``), else the bundled ``english_words.txt``.
* Where nothing fits, a clear error (RULER loops forever).
* The essay haystack is Paul Graham's essays in RULER; here whatever
  :func:`restkv.eval.benchmarks.shared.haystack.load_haystack` returns for ``bench.haystack`` (the bundled novel by
  default), recorded in ``meta["haystack"]``.
"""

from restkv.eval.benchmarks.ruler.benchmark import RulerBenchmark, average_per_length, check_grid
from restkv.eval.benchmarks.ruler.common_words import CommonWords, cwe_builder
from restkv.eval.benchmarks.ruler.files import Found, TaskFile, find_files, read_samples
from restkv.eval.benchmarks.ruler.fitting import (
    Build,
    Count,
    Draft,
    Fit,
    TokenCounter,
    TooShort,
    fit_prompt,
    ramp_size,
    search_size,
    step_down,
)
from restkv.eval.benchmarks.ruler.freq_words import FreqWords, fwe_builder
from restkv.eval.benchmarks.ruler.generator import generate, official_start
from restkv.eval.benchmarks.ruler.haystacks import (
    DEPTHS,
    SENTENCE_SPLITTERS,
    Essay,
    essay_with_needles,
    essay_words_and_starts,
    lines_with_needles,
    parse_essay,
    resolve_splitter,
)
from restkv.eval.benchmarks.ruler.niah import Niah, niah_builder
from restkv.eval.benchmarks.ruler.plan import FITS, Job, Plan, RulerData
from restkv.eval.benchmarks.ruler.qa import QA, qa_builder
from restkv.eval.benchmarks.ruler.qa_data import QAData, Question, load_qa
from restkv.eval.benchmarks.ruler.tasks import (
    OFFLINE_TASKS,
    TASK_CONFIGS,
    TASKS,
    TaskConfig,
    max_new_tokens,
    task_config,
)
from restkv.eval.benchmarks.ruler.templates import (
    DOCUMENT_TEMPLATE,
    FAMILIES,
    NEEDLE_TEMPLATE,
    NOISE_SENTENCE,
    Family,
    split_prompt,
    split_template,
)
from restkv.eval.benchmarks.ruler.variable_tracking import VariableTracking, vt_builder, vt_example
from restkv.eval.benchmarks.ruler.words import (
    VOCABULARIES,
    Vocabulary,
    english_words,
    key_words,
    prefix_sample,
    random_value,
    vocabulary,
)

__all__ = [
    "DEPTHS",
    "DOCUMENT_TEMPLATE",
    "FAMILIES",
    "FITS",
    "NEEDLE_TEMPLATE",
    "NOISE_SENTENCE",
    "OFFLINE_TASKS",
    "QA",
    "SENTENCE_SPLITTERS",
    "TASKS",
    "TASK_CONFIGS",
    "VOCABULARIES",
    "Build",
    "CommonWords",
    "Count",
    "Draft",
    "Essay",
    "Family",
    "Fit",
    "Found",
    "FreqWords",
    "Job",
    "Niah",
    "Plan",
    "QAData",
    "Question",
    "RulerBenchmark",
    "RulerData",
    "TaskConfig",
    "TaskFile",
    "TokenCounter",
    "TooShort",
    "VariableTracking",
    "Vocabulary",
    "average_per_length",
    "check_grid",
    "cwe_builder",
    "english_words",
    "essay_with_needles",
    "essay_words_and_starts",
    "find_files",
    "fit_prompt",
    "fwe_builder",
    "generate",
    "key_words",
    "lines_with_needles",
    "load_qa",
    "max_new_tokens",
    "niah_builder",
    "official_start",
    "parse_essay",
    "prefix_sample",
    "qa_builder",
    "ramp_size",
    "random_value",
    "read_samples",
    "resolve_splitter",
    "search_size",
    "split_prompt",
    "split_template",
    "step_down",
    "task_config",
    "vocabulary",
    "vt_builder",
    "vt_example",
]
