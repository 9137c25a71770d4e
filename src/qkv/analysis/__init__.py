"""What each head does: Clark et al. (2019)'s statistics, TransformerLens's detectors, roles.

    >>> from qkv.analysis import analyse
    >>> report = analyse("minilm", ["The cat sat on the mat."])
    >>> report.roles[0][2]                       # layer 0, head 2
    'previous'

stats.py (one text's numbers per head) → detectors.py → roles.py; corpus.py reads files
and cuts windows; text.py analyses one text; backends.py runs many (here, local cores,
Ray); totals.py adds them up in order and checkpoints; run.py ties it together.
Beyond attention weights: lens.py (the logit lens), rollout.py (attention rollout and flow),
attribution.py (direct logit attribution), input_attribution.py (gradients
with respect to the input tokens: saliency, gradient × input, integrated gradients), patch.py (activation patching), atp.py (attribution patching, AtP and AtP*: patch's tables
estimated from two forwards and one backward), edges.py and eap.py (edge attribution patching, EAP and EAP-IG:
scores of the edges between heads, FFNs, embedding and logits, the top edges as a circuit, its faithfulness by
edge patching), causal_trace.py (causal tracing: where a fact is recalled), circuits.py (a head's
QK and OV circuits), neurons.py (FFN neurons as key–value memories: top contexts over a corpus, promoted tokens),
steering.py (contrastive steering vectors and directional ablation, kept as llama.cpp control vectors),
probes.py (linear probes per layer with a control task),
occlusion.py (forward-only prompt attribution: occlusion and Shapley values over tokens or spans),
diff.py (model diffing: two checkpoints' heads, stream and lens on one text; quantisation diffing); hooks that read or replace intermediates live in the core (qkv.core.hooks).
Everything here computes: the figures are drawn in qkv.viz (interpret_figures, head_maps) from the
results, and sections.py hands them to the viewer's panels (viz.interpret_payload).
"""

from ..runtime.lazy import submodule
from .attribution import direct_logit_attribution
from .causal_trace import trace_fact
from .circuits import copying_scores, ov_circuit, qk_positions
from .corpus import Corpus, open_corpus
from .detectors import DETECTORS, induction_scores, pattern_score
from .input_attribution import attribute
from .lens import logit_lens
from .neurons import neurons
from .patch import patch
from .roles import ROLES, THRESHOLDS, classify
from .rollout import attention_flow, attention_rollout
from .run import HeadReport, analyse
from .stats import STATS, head_stats

__all__ = ["analyse", "HeadReport", "head_stats", "STATS", "DETECTORS", "ROLES", "THRESHOLDS", "classify",
           "pattern_score", "induction_scores", "open_corpus", "Corpus", "logit_lens", "attention_rollout",
           "direct_logit_attribution", "attribute", "patch", "ov_circuit", "qk_positions", "copying_scores", "attention_flow",
           "neurons", "trace_fact"]


def __getattr__(name: str):
    """A submodule as an attribute (`qkv.analysis.sections` after `import qkv`), imported on first use."""
    return submodule(__name__, name)
