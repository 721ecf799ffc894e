"""Figures a user would rather look at than read: loss curves and piano rolls (matplotlib)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def plot_history(history, path):
    """Training loss and validation bound (nats per step) against epochs, saved to ``path``."""
    epochs = [row["epoch"] for row in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [-row["train_loss_per_step"] for row in history], label="train bound")
    if "valid_elbo_per_step" in history[0]:
        ax.plot(epochs, [row["valid_elbo_per_step"] for row in history], label="validation ELBO")
        ax2 = ax.twinx()
        ax2.plot(epochs, [row["valid_kl_per_step"] for row in history], "C2--", label="validation KL")
        ax2.set_ylabel("KL (nats / step)")
        ax2.legend(loc="lower right")
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
