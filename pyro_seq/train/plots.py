"""Figures a user would rather look at than read: loss curves, piano rolls, videos (matplotlib)."""

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
        ax2.plot(
            epochs, [row["valid_kl_per_step"] for row in history], "C2--", label="validation KL"
        )
        ax2.set_ylabel("KL (nats / step)")
        ax2.legend(loc="lower right")
    elif "valid_pll_per_step" in history[0]:
        ax.plot(
            epochs,
            [row["valid_pll_per_step"] for row in history],
            label="validation pseudo-log-likelihood",
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel("bound (nats / step)")
    if ax.get_legend_handles_labels()[0]:  # a run without a bound to plot draws no legend
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
        ax.imshow(
            img.T.numpy(),
            aspect="auto",
            origin="lower",
            cmap="Greys",
            vmin=0,
            vmax=1,
            extent=(0, img.shape[0], lowest_note - 0.5, lowest_note + img.shape[1] - 0.5),
        )
        ax.set_xlabel("time step")
        ax.set_ylabel("MIDI note")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_features(values, path, title="sample", max_lines=8):
    """Real-valued features ``(T, D)`` over time saved as a PNG: a heat map of every feature and
    the curves of the first ``max_lines``."""
    values = torch.as_tensor(values).float()
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), squeeze=False)
    image = axes[0, 0].imshow(
        values.T.numpy(),
        aspect="auto",
        origin="lower",
        cmap="viridis",
        extent=(0, values.shape[0], -0.5, values.shape[1] - 0.5),
    )
    fig.colorbar(image, ax=axes[0, 0])
    axes[0, 0].set_ylabel("feature")
    axes[0, 0].set_title(f"{title}: features")
    for d in range(min(values.shape[1], max_lines)):
        axes[1, 0].plot(values[:, d].numpy(), label=f"{d}")
    axes[1, 0].set_xlabel("time step")
    axes[1, 0].set_title(f"{title}: the first {min(values.shape[1], max_lines)} features")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_recovery(clean, corrupted, recovered, path, probs=None, title="recovery", lowest_note=21):
    """Bayer & Osendorfer (2014), Fig. 3: clean / corrupted / recovered piano rolls and the
    errors, as one PNG.

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
    panels = [
        (clean, "clean"),
        (torch.nan_to_num(corrupted, nan=0.5), "corrupted (grey: missing)"),
        (shown, "recovered" if probs is None else "recovered (probabilities)"),
        (errors, f"errors ({int(errors.sum())} of {errors.numel()})"),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), squeeze=False)
    for ax, (img, name) in zip(axes[:, 0], panels):
        ax.imshow(
            img.T.numpy(),
            aspect="auto",
            origin="lower",
            cmap="Greys",
            vmin=0,
            vmax=1,
            extent=(0, img.shape[0], lowest_note - 0.5, lowest_note + img.shape[1] - 0.5),
        )
        ax.set_ylabel("MIDI note")
        ax.set_title(f"{title}: {name}")
    axes[-1, 0].set_xlabel("time step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return int(errors.sum())


def video_trajectory(frames):
    """A video ``(T, H, W)`` of intensities in ``[0, 1]`` as one image, darker for later frames.

    Thesis Fig. 6.4d / 6.5: ``image = max_t (t + 1) / T * frames[t]`` (``t = 0..T-1``), so pixel
    values say when the object was last there; drawn with a white-to-black map, the trajectory
    darkens with time. Returns a ``float32`` tensor ``(H, W)``.
    """
    frames = torch.as_tensor(frames).float()
    if frames.dim() != 3:
        raise ValueError(f"frames must be (T, H, W), got shape {tuple(frames.shape)}")
    weights = torch.arange(1, frames.shape[0] + 1, dtype=frames.dtype) / frames.shape[0]
    return (frames * weights[:, None, None]).amax(0)


def plot_video(frames, path, positions=None, title="video", max_frames=20):
    """A video's trajectory image (thesis Fig. 6.5) beside a grid of its frames, as a PNG.

    :param frames: ``(T, H, W)`` intensities in ``[0, 1]`` (e.g. one video of
        :mod:`pyro_seq.data.simulators`).
    :param positions: optional ``(T, 2)`` ground-truth positions in pixels (``x`` along the
        columns, ``y`` down the rows), drawn over the trajectory as points coloured by time.
    :param max_frames: at most this many frames in the grid (evenly spaced, first and last
        included), five per row.
    """
    frames = torch.as_tensor(frames).float()
    T, H, W = frames.shape
    shown = torch.linspace(0, T - 1, min(T, max_frames)).round().long().unique().tolist()
    cols = min(5, len(shown))
    rows = -(-len(shown) // cols)
    fig = plt.figure(figsize=(5.0 + 1.1 * cols, max(4.2, 1.2 * rows)), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=(5.0, 1.1 * cols))
    ax = left.subplots()
    ax.imshow(
        video_trajectory(frames).numpy(),
        cmap="Greys",
        vmin=0,
        vmax=1,
        interpolation="nearest",
        extent=(0, W, H, 0),
    )
    if positions is not None:
        pos = torch.as_tensor(positions).float()
        scatter = ax.scatter(pos[:, 0], pos[:, 1], c=range(T), cmap="viridis", s=12, zorder=3)
        ax.plot(pos[:, 0], pos[:, 1], color="C1", lw=0.8, zorder=2)
        left.colorbar(scatter, ax=ax, label="time step", shrink=0.8)
    ax.set_title(f"{title}: trajectory (darker = later)")
    ax.set_xlabel("x (px)")
    ax.set_ylabel("y (px)")
    axes = right.subplots(rows, cols, squeeze=False).ravel()
    for k, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if k < len(shown):
            ax.imshow(
                frames[shown[k]].numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest"
            )
            ax.set_title(f"t={shown[k]}", fontsize=8)
        else:
            ax.axis("off")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def show_inline(path):
    """Display the saved image ``path`` inline when running under a Jupyter kernel (the executed
    tutorial pages of the docs); a no-op in a plain script, which keeps only the file."""
    import sys

    if "ipykernel" in sys.modules:
        from IPython.display import Image, display

        display(Image(filename=str(path)))
