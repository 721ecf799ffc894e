"""Figures a user would rather look at than read: loss curves and piano rolls (matplotlib)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def plot_history(history, path):
    """Training loss and validation bound (nats per step) against epochs, saved to ``path``."""
    epochs = [row["epoch"] for row in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    if "train_loss_per_step" in history[0]:
        ax.plot(epochs, [-row["train_loss_per_step"] for row in history], label="train bound")
    if "valid_elbo_per_step" in history[0]:
        ax.plot(epochs, [row["valid_elbo_per_step"] for row in history], label="validation ELBO")
        ax2 = ax.twinx()
        ax2.plot(epochs, [row["valid_kl_per_step"] for row in history], "C2--", label="validation KL")
        ax2.set_ylabel("KL (nats / step)")
        ax2.legend(loc="lower right")
    elif "valid_pll_per_step" in history[0]:
        ax.plot(epochs, [row["valid_pll_per_step"] for row in history],
                label="validation pseudo-log-likelihood")
    ax.set_xlabel("epoch")
    ax.set_ylabel("bound (nats / step)")
    ax.legend(loc="upper left")
    ax.set_title("training progress")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_piano_roll(roll, path, probs=None, title="sample", lowest_note=21):
    """Piano roll ``(T, 88)`` of 0/1 (and optionally its probabilities) saved as a PNG."""
    roll = torch.as_tensor(roll).float()
    panels = 1 if probs is None else 2
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3 * panels), squeeze=False)
    images = [(roll, f"{title}: notes")]
    if probs is not None:
        images.append((torch.as_tensor(probs).float(), f"{title}: note probabilities"))
    for ax, (img, name) in zip(axes[:, 0], images):
        ax.imshow(img.T.numpy(), aspect="auto", origin="lower", cmap="Greys", vmin=0, vmax=1,
                  extent=(0, img.shape[0], lowest_note - 0.5, lowest_note + img.shape[1] - 0.5))
        ax.set_xlabel("time step")
        ax.set_ylabel("MIDI note")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_recovery(clean, corrupted, recovered, path, probs=None, title="recovery", lowest_note=21):
    """Seed 002 Fig. 3: clean / corrupted / recovered piano rolls and the errors, as one PNG.

    :param clean: ``(T, 88)`` 0/1, the original.
    :param corrupted: ``(T, 88)``: the input (missing entries may be NaN: drawn grey).
    :param recovered: ``(T, 88)`` 0/1, the model's completion or denoised roll.
    :param probs: optional ``(T, 88)`` probabilities, drawn instead of ``recovered``'s 0/1.
    :returns: the number of wrong elements of ``recovered``.
    """
    clean, recovered = torch.as_tensor(clean).float(), torch.as_tensor(recovered).float()
    corrupted = torch.as_tensor(corrupted).float()
    errors = (recovered != clean).float()
    shown = recovered if probs is None else torch.as_tensor(probs).float()
    panels = [(clean, "clean"), (torch.nan_to_num(corrupted, nan=0.5), "corrupted (grey: missing)"),
              (shown, "recovered" if probs is None else "recovered (probabilities)"),
              (errors, f"errors ({int(errors.sum())} of {errors.numel()})")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), squeeze=False)
    for ax, (img, name) in zip(axes[:, 0], panels):
        ax.imshow(img.T.numpy(), aspect="auto", origin="lower", cmap="Greys", vmin=0, vmax=1,
                  extent=(0, img.shape[0], lowest_note - 0.5, lowest_note + img.shape[1] - 0.5))
        ax.set_ylabel("MIDI note")
        ax.set_title(f"{title}: {name}")
    axes[-1, 0].set_xlabel("time step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return int(errors.sum())
