"""`sao init-model`, `sao sft`, `sao pretrain-value`: make and prepare checkpoints before RL."""

from __future__ import annotations

from typing import Annotated

import typer

from sao.cli.common import _fail, _quiet_transformers, app

# The trainer's precision, as the run config's model.dtype / model.master_dtype (sao.models.precision).
ComputeDtype = Annotated[
    str, typer.Option(help="Compute dtype: auto (bfloat16 on CUDA, float32 else), float32, bfloat16.")
]
MasterDtype = Annotated[str, typer.Option(help="Weights, gradients and AdamW state: float32 or bfloat16.")]


@app.command("init-model")
def init_model_command(
    out: Annotated[str, typer.Option("--out", help="Directory to write the checkpoint into.")],
    arch: Annotated[str, typer.Option("--arch", help="Architecture: qwen3_moe or qwen3.")] = "qwen3_moe",
    size: Annotated[
        str, typer.Option("--size", help="Size: test (unit tests) or small (CPU quickstart).")
    ] = "test",
    seed: Annotated[int, typer.Option("--seed", help="Weight initialisation seed.")] = 0,
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer", help="Tokenizer: byte (256 byte tokens) or bpe (~4k-token BPE trained locally)."
        ),
    ] = "byte",
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            help="Chat template saved with the tokenizer: qwen3, qwen3_coder, hermes, sao, or a .jinja file "
            "(default: sao for byte, qwen3 for bpe).",
        ),
    ] = None,
) -> None:
    """Write a tiny randomly initialised Hugging Face checkpoint (weights, config, tokenizer)."""
    # Heavy (torch, transformers): imported on use, so `import sao.cli` stays light.
    from sao.models.templates import load_chat_template
    from sao.models.tiny import TINY_ARCHS, TINY_SIZES, count_parameters, tiny_checkpoint, tiny_config
    from sao.models.tokenizer import TOKENIZER_KINDS

    if arch not in TINY_ARCHS:
        raise _fail(f"error: --arch: unknown architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}")
    if size not in TINY_SIZES:
        raise _fail(f"error: --size: unknown size {size!r}; choose one of {', '.join(TINY_SIZES)}")
    if tokenizer not in TOKENIZER_KINDS:
        raise _fail(
            f"error: --tokenizer: unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZER_KINDS)}"
        )
    if chat_template is not None:
        try:
            load_chat_template(chat_template)
        except ValueError as err:
            raise _fail(f"error: --chat-template: {err}") from None
    _quiet_transformers()  # the command prints one line
    try:
        path = tiny_checkpoint(out, arch, size, seed, tokenizer, chat_template)  # type: ignore[arg-type]
    except OSError as err:
        raise _fail(f"error: cannot write {out!r}: {err}", code=1) from None
    params = count_parameters(tiny_config(arch, size, tokenizer))  # type: ignore[arg-type]  # checked above
    what = f"{arch}/{size} checkpoint ({tokenizer} tokenizer, seed {seed}, {params:,} parameters)"
    typer.echo(f"wrote {what} to {path}")


@app.command("sft")
def sft_command(
    model: Annotated[str, typer.Option("--model", help="Checkpoint directory to fine-tune.")],
    data: Annotated[str, typer.Option("--data", help='Chat JSONL: {"messages": [...]} per line.')],
    out: Annotated[str, typer.Option("--out", help="Directory for the fine-tuned checkpoint.")],
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 200,
    lr: Annotated[
        float, typer.Option(help="Peak learning rate (tiny models ~1e-3, real ones ~1e-5).")
    ] = 1e-3,
    batch_size: Annotated[int, typer.Option(help="Conversations per step.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="Tokens per conversation (longer ones truncated).")] = 2048,
    eval_frac: Annotated[float, typer.Option(help="Held-out share for the eval loss.")] = 0.1,
    eval_every: Annotated[int, typer.Option(help="Steps between eval losses.")] = 25,
    seed: Annotated[int, typer.Option(help="Data order and split seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: ComputeDtype = "auto",
    master_dtype: MasterDtype = "float32",
    gradient_checkpointing: Annotated[
        bool | None,
        typer.Option("--gradient-checkpointing/--no-gradient-checkpointing", help="Default: on with CUDA."),
    ] = None,
    chat_template: Annotated[
        str | None,
        typer.Option(
            help="Replace the checkpoint's chat template: a shipped name (qwen3, qwen3_coder, hermes, sao) "
            "or a .jinja."
        ),
    ] = None,
    enable_thinking: Annotated[
        bool | None,
        typer.Option("--enable-thinking/--disable-thinking", help="Bound into the chat template (saved)."),
    ] = None,
) -> None:
    """Supervised warm start: loss on assistant tokens only (the RL action mask)."""
    from sao.train.sft import SFTOptions, run_sft

    _quiet_transformers()
    opts = SFTOptions(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        max_tokens=max_tokens,
        eval_frac=eval_frac,
        eval_every=eval_every,
        seed=seed,
        device=device,
        dtype=dtype,
        master_dtype=master_dtype,
        gradient_checkpointing=gradient_checkpointing,
        chat_template=chat_template,
        enable_thinking=enable_thinking,
    )
    try:
        run_sft(model, data, out, opts)
    except (OSError, ValueError) as err:
        raise _fail(f"error: {err}", code=1) from None


@app.command("pretrain-value")
def pretrain_value_command(
    model: Annotated[str, typer.Option("--model", help="Policy checkpoint the critic starts from.")],
    corpus: Annotated[str, typer.Option("--corpus", help="JSONL of Trajectory from the initial policy.")],
    out: Annotated[str, typer.Option("--out", help="Directory for the pretrained critic.")],
    corpus_size: Annotated[
        int, typer.Option(help="Trajectories used (sampled if the file has more).")
    ] = 1024,
    max_steps: Annotated[int, typer.Option(help="Upper bound on critic steps.")] = 200,
    ev_patience: Annotated[int, typer.Option(help="Evaluations without EV gain before stopping.")] = 10,
    ev_min_delta: Annotated[float, typer.Option(help="EV gain that counts as improvement.")] = 0.01,
    lr: Annotated[float, typer.Option(help="Critic learning rate.")] = 5e-6,
    batch_size: Annotated[int, typer.Option(help="Trajectories per critic step.")] = 32,
    eval_every: Annotated[int, typer.Option(help="Steps between held-out EV evaluations.")] = 5,
    freeze: Annotated[str, typer.Option(help="Critic parameters frozen: none or attention.")] = "none",
    gamma: Annotated[float, typer.Option(help="Discount of the Monte-Carlo returns.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampling and split seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: ComputeDtype = "auto",
    master_dtype: MasterDtype = "float32",
) -> None:
    """Pretrain the critic on Monte-Carlo returns of the initial policy (the paper's cold-start fix)."""
    from sao.train.value_pretrain import ValuePretrainOptions, run_value_pretrain

    _quiet_transformers()
    if freeze not in ("none", "attention"):
        raise _fail(f"error: --freeze: must be 'none' or 'attention', got {freeze!r}")
    opts = ValuePretrainOptions(
        corpus_size=corpus_size,
        max_steps=max_steps,
        ev_patience=ev_patience,
        ev_min_delta=ev_min_delta,
        lr=lr,
        batch_size=batch_size,
        eval_every=eval_every,
        freeze=freeze,
        gamma=gamma,
        seed=seed,
        device=device,
        dtype=dtype,
        master_dtype=master_dtype,
    )
    try:
        run_value_pretrain(model, corpus, out, opts)
    except (OSError, ValueError) as err:
        raise _fail(f"error: {err}", code=1) from None
