"""One configuration dataclass for the four lightweight methods and the subtraction baseline.

Defaults are the paper sizes (hidden 512, word embedding 300, 8 heads, 2 decoder layers) and the
CLEVR-Change loss weights of each paper; `paper_settings(method, dataset)` gives the per-dataset values
the papers (or the released code) report, to be applied with `dataclasses.replace` or `**`.
Tags in comments follow methods.md: [P] paper, [C] official code, [D] our default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

METHOD_NAMES = ("subtraction", "scorer", "dirl", "rdd", "cheer")
POSITION_KINDS = ("sinusoidal", "learned")
CAPTION_LOSS_KINDS = ("token_mean", "sentence_mean")
GATE_LOSS_KINDS = ("gate", "map", "correlation")


@dataclass
class LightweightConfig:
    """Sizes, loss weights and switches of one lightweight change captioner.

    `feat_dim` is the number of channels entering the 1×1 projection, as in the reference configs:
    1024 for ResNet-101 layer3 features, 1026 when `coord_channels` appends the two coordinate maps
    (then the incoming feature maps must have 1024 channels).

    `reference_quirks=True` switches every method to the exact behaviour of the released code where it
    departs from the paper (SCORER: GELU "FFN" decoder layer without attention output projections,
    padded-length sentence mean in CBR, frozen CBR parameters; DIRL: CCR on padded means with averaged
    logits). The default follows the papers and methods.md's [D] choices.
    """

    method: str = "scorer"
    # Front-end (§0.3-0.4)
    feat_dim: int = 1024
    coord_channels: bool = False
    grid_size: int = 14
    feature_pool: int = 1  # [D] demo size: average-pool the grid by this factor before the projection
    hidden: int = 512
    heads: int = 8
    dropout: float = 0.1
    encoder_layers: int = 2
    # [D] SCORER/DIRL/CHEER cross-view attentions start with W_K = W_Q and W_V (W_O) = I: the first attention is the
    # content similarity of the two views (each token finds its counterpart), the first reconstruction of an
    # unchanged token is the token itself (attention.tie_query_key). False: the papers' random init.
    matching_init: bool = False
    # [D] SCORER's Eq. 7 / CHEER's Eq. 12 / RDD's Eq. 5 fusion Linear([X_bef; X_aft]) starts as X_aft − X_bef
    # ([−I, I], bias 0), so the decoder reads a difference from step 0, as DIRL's Eq. 6 and subtraction do.
    # False: random init.
    difference_init: bool = False
    # [D] front-end: "scaled" standardises the features per channel (train-split statistics) and starts the 1×1
    # projection at N(0, 1/fan_in) and the position tables at N(0, 0.1²); "paper": raw features, PyTorch's
    # default projection init and N(0, 1) position tables, as the references.
    frontend_init: str = "scaled"
    # [D] decoder init std: None = 0.02·√(512/hidden), the reference's scale at any width; 0.02 = the reference's.
    decoder_init_std: float | None = None
    # Decoder (§0.5, §7.2)
    vocab_size: int = 76
    max_len: int = 24  # decoder positions: <START> + words + <END> (CLEVR-Change 24, CLEVR-DC 40)
    word_emb: int = 300
    layers: int = 2
    ffn_dim: int = 2048
    positions: str | None = None  # None: the method's own ("learned" for RDD, else "sinusoidal")
    caption_loss: str | None = None  # None: "sentence_mean" for RDD (Eq. 15), else "token_mean"
    reference_quirks: bool = False
    # SCORER+CBR (§1): L = L_cap + λ_v L_cv + λ_r L_cbr, CLEVR-Change values
    cv_weight: float = 0.1
    cbr_weight: float = 0.001
    mtm_mode: str = "summed_heads"  # [C] heads summed before the max; "per_head_mean" = paper reading
    freeze_cbr_params: bool | None = None  # None: follow reference_quirks (the released code never updates CBR)
    # DIRL+CCR (§2): L = L_cap + λ_d L_dirl + λ_c L_ccr, CLEVR-Change values
    dirl_weight: float = 0.5
    ccr_weight: float = 0.3
    dirl_alpha: float = 0.003
    dirl_correlation: str = "zscore"  # [C] z-scored token-level; "cosine" = Eq. 3 as printed
    ccr_temperature: float = 0.5
    ccr_mode: str | None = None  # None: "code" with reference_quirks, else "paper"
    # Eq. 6 as printed, F~ − F^s (True: [D] LN(F~) − F^s; measured worse with matching_init, docs/lightweight_demo.md)
    dirl_normalize_difference: bool = False
    dirl_pairs: str = "distractor"  # [D] scene batches: L_dirl on the distractor pair only ("all": the paper)
    # RDD+ACR (§3): L = L_XE + λ_1 L_N2O + λ_2 L_V2A
    rdd_objects: int = 32
    rdd_actions: int = 5
    rdd_distill_steps: int = 2  # N shared-weight distilling blocks [D]
    # [D] GDE residual: "difference" F^_x = F_diff + MHCA(F_x, F_diff); "image" F^_x = F_x + MHCA(F_x, F_diff)
    # (with difference_init, Eq. 5's Linear starts as F^_aft − F^_bef); "none" = Eqs. 3-4 as printed
    rdd_gde_residual: str = "difference"
    rdd_decoder_tokens: str = "global"  # the decoder reads the fused H·W tokens (RDD: F~_diff ∈ R^{HW×C}) or "all"
    n2o_weight: float = 0.1  # [D]
    v2a_weight: float = 0.1  # [D]
    acr_temperature: float = 0.07  # [D]
    acr_mask_duplicates: bool = True  # [D] identical texts in a batch are not each other's negatives
    acr_text_dim: int = 512  # CLIP text embedding size (ViT-B text tower) [D]
    acr_prompt_tokens: int = 4  # learnable CoOp context tokens [P]
    acr_token_width: int = 512  # CLIP token-embedding width the context vectors live in
    # CHEER (§4): L = L_S + λ_v (L_C + L_D) + λ_m L_I
    cheer_entities: int = 3  # K retrieved entities [P]
    entity_dim: int = 768  # CLIP ViT-L/14 text embedding [BG]
    entity_bank_size: int = 0  # >0: entities may be given as ids into a stored (M, entity_dim) bank
    gate_weight: float = 0.75  # λ_v [P]
    cheer_contrastive_weight: float = 0.5  # λ_m [P]
    # "correlation" [D]: 1 − Pearson correlation of the two match maps over positions; "gate": MSE on the
    # post-sigmoid gates (B,N,D), minimised by constant gates; "map": MSE on max_j P (B,N)
    gate_loss_on: str = "correlation"
    enhance_temperature: float = 0.1  # initial τ_e of the CRE/DRE softmax [D]

    def __post_init__(self) -> None:
        if self.method not in METHOD_NAMES:
            raise ValueError(f"unknown lightweight method {self.method!r}; choose from {', '.join(METHOD_NAMES)}")
        if self.hidden % self.heads or self.hidden % 2:
            raise ValueError(f"hidden={self.hidden} must be even and divisible by heads={self.heads}")
        if self.coord_channels and self.feat_dim <= 2:
            raise ValueError("with coord_channels, feat_dim counts the 2 coordinate channels (e.g. 1026)")
        if self.positions is not None and self.positions not in POSITION_KINDS:
            raise ValueError(f"positions must be one of {POSITION_KINDS}, got {self.positions!r}")
        if self.caption_loss is not None and self.caption_loss not in CAPTION_LOSS_KINDS:
            raise ValueError(f"caption_loss must be one of {CAPTION_LOSS_KINDS}, got {self.caption_loss!r}")
        if self.mtm_mode not in ("summed_heads", "per_head_mean"):
            raise ValueError(f"mtm_mode must be 'summed_heads' or 'per_head_mean', got {self.mtm_mode!r}")
        if self.dirl_correlation not in ("zscore", "cosine"):
            raise ValueError(f"dirl_correlation must be 'zscore' or 'cosine', got {self.dirl_correlation!r}")
        if self.ccr_mode is not None and self.ccr_mode not in ("paper", "code"):
            raise ValueError(f"ccr_mode must be 'paper' or 'code', got {self.ccr_mode!r}")
        if self.gate_loss_on not in GATE_LOSS_KINDS:
            raise ValueError(f"gate_loss_on must be one of {GATE_LOSS_KINDS}, got {self.gate_loss_on!r}")
        if self.frontend_init not in ("scaled", "paper"):
            raise ValueError(f"frontend_init must be 'scaled' or 'paper', got {self.frontend_init!r}")
        if self.decoder_init_std is not None and not self.decoder_init_std > 0:
            raise ValueError(f"decoder_init_std must be a positive number or null, got {self.decoder_init_std!r}")
        if self.rdd_gde_residual not in ("difference", "image", "none"):
            raise ValueError(f"rdd_gde_residual must be 'difference', 'image' or 'none', got {self.rdd_gde_residual!r}")
        if self.rdd_decoder_tokens not in ("global", "all"):
            raise ValueError(f"rdd_decoder_tokens must be 'global' or 'all', got {self.rdd_decoder_tokens!r}")
        if self.dirl_pairs not in ("all", "distractor"):
            raise ValueError(f"dirl_pairs must be 'all' or 'distractor', got {self.dirl_pairs!r}")
        if self.max_len < 2 or self.vocab_size < 5:
            raise ValueError("max_len must be >= 2 and vocab_size >= 5 (4 special tokens + a word)")

    # Resolved switches (None = the method's own choice)
    @property
    def resolved_positions(self) -> str:
        return self.positions or ("learned" if self.method == "rdd" else "sinusoidal")

    @property
    def resolved_caption_loss(self) -> str:
        return self.caption_loss or ("sentence_mean" if self.method == "rdd" else "token_mean")

    @property
    def resolved_ccr_mode(self) -> str:
        return self.ccr_mode or ("code" if self.reference_quirks else "paper")

    @property
    def resolved_freeze_cbr(self) -> bool:
        return self.reference_quirks if self.freeze_cbr_params is None else self.freeze_cbr_params

    @property
    def backbone_channels(self) -> int:
        """Channels of the incoming feature maps (without the coordinate channels)."""
        return self.feat_dim - 2 if self.coord_channels else self.feat_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "LightweightConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown LightweightConfig field(s): {', '.join(unknown)}")
        return cls(**values)


# Per-dataset settings from the papers / released configs (methods.md §1.3, §1.5, §2.3, §3.5, §4.5).
# Model fields go into LightweightConfig; "batch_size"/"lr" are for the trainer.
_CLEVR_CHANGE = {"vocab_size": 76, "max_len": 24, "coord_channels": True, "feat_dim": 1026}
_CLEVR_DC = {"vocab_size": 87, "max_len": 40}
PAPER_SETTINGS: dict[str, dict[str, dict]] = {
    "subtraction": {
        "clevr_change": {**_CLEVR_CHANGE, "batch_size": 128, "lr": 2e-4},
        "clevr_dc": {**_CLEVR_DC, "batch_size": 128, "lr": 2e-4},
        "spot_the_diff": {"batch_size": 32, "lr": 2e-4},
        "ier": {"batch_size": 16, "lr": 1e-4},
        "levir_cc": {"batch_size": 64, "lr": 1e-4},
    },
    "scorer": {
        "clevr_change": {**_CLEVR_CHANGE, "cv_weight": 0.1, "cbr_weight": 0.001, "encoder_layers": 2,
                         "batch_size": 128, "lr": 2e-4},
        "clevr_dc": {**_CLEVR_DC, "cv_weight": 0.01, "cbr_weight": 0.004, "encoder_layers": 1,
                     "batch_size": 128, "lr": 2e-4},
        "spot_the_diff": {"cv_weight": 0.3, "cbr_weight": 0.5, "encoder_layers": 3, "batch_size": 32, "lr": 2e-4},
        "ier": {"cv_weight": 0.003, "cbr_weight": 0.06, "encoder_layers": 2, "batch_size": 16, "lr": 1e-4},
    },
    "dirl": {
        "clevr_change": {**_CLEVR_CHANGE, "dirl_weight": 0.5, "ccr_weight": 0.3, "batch_size": 128, "lr": 2e-4},
        "clevr_dc": {**_CLEVR_DC, "dirl_weight": 0.03, "ccr_weight": 0.05, "batch_size": 128, "lr": 2e-4},
        "spot_the_diff": {"dirl_weight": 0.5, "ccr_weight": 0.004, "batch_size": 32, "lr": 2e-4},
        "ier": {"dirl_weight": 0.001, "ccr_weight": 0.05, "batch_size": 16, "lr": 1e-4},
    },
    "rdd": {
        "clevr_change": {"vocab_size": 76, "max_len": 24, "rdd_actions": 5, "batch_size": 128, "lr": 2e-4},
        "levir_cc": {"rdd_actions": 10, "batch_size": 64, "lr": 1e-4},
        "spot_the_diff": {"rdd_actions": 10, "batch_size": 32, "lr": 2e-4},
    },
    "cheer": {
        "clevr_change": {"vocab_size": 76, "max_len": 24, "encoder_layers": 2, "batch_size": 128, "lr": 1e-3},
        "clevr_dc": {**_CLEVR_DC, "encoder_layers": 1, "batch_size": 128, "lr": 1e-3},
        "spot_the_diff": {"encoder_layers": 2, "batch_size": 96, "lr": 5e-4},
    },
}
TRAINER_KEYS = ("batch_size", "lr")


def paper_settings(method: str, dataset: str) -> tuple[dict, dict]:
    """(model fields, trainer fields) the papers give for `method` on `dataset`; KeyError if none reported."""
    if method not in PAPER_SETTINGS:
        raise KeyError(f"unknown lightweight method {method!r}; choose from {', '.join(METHOD_NAMES)}")
    table = PAPER_SETTINGS[method]
    if dataset not in table:
        raise KeyError(f"{method} reports no settings for {dataset!r}; known: {', '.join(sorted(table))}")
    values = table[dataset]
    model = {k: v for k, v in values.items() if k not in TRAINER_KEYS}
    trainer = {k: v for k, v in values.items() if k in TRAINER_KEYS}
    return model, trainer
