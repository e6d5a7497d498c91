"""The published figures each benchmark config is held against, as data with their sources.

Every point traces to a figure or a data file named in its anchor, with a note of how it
was read: no number here is typed from memory. A curve is (env steps, value) pairs;
`Anchor.at` interpolates linearly in steps between them and gives None outside their range
(a published curve says nothing past its last point). Env steps count one step of one env
(all its agents together, as JaxMARL counts them; MinAtar has no frame skip, so its frames
are env steps). `bench.report.published` renders our runs beside these.

Where a figure could not be read (the JaxMARL report's SMAX, Overcooked and Hanabi curves
exist only as images in the paper, which no stored copy here shows), the config has no
anchor and its `note` says so: the table then shows our figure alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

OVERSHOOT = 0.01
"""How far past a curve's last point (a fraction of its steps) a run still reads it."""
RETURN = "episode_return_mean"
EVAL_RETURN = "eval_return_mean"
WIN_RATE = "win_rate"


@dataclass(frozen=True)
class Anchor:
    """One published curve (or final value): what it is, where it is, how it was read."""

    source: str
    """Short label for the table."""
    reference: str
    """Paper, repository, figure or file, and URL."""
    definition: str
    """What the published value measures there."""
    points: tuple[tuple[float, float], ...]
    """(env steps, value), steps increasing."""
    read: str
    """How the points were taken off the source, and how far to trust them."""

    def at(self, steps: float) -> float | None:
        """The published value at `steps`, linear in steps between points; None outside,
        but within `OVERSHOOT` past the last point (a run stops on the chunk that passes
        its frame limit: 10.03M for 10M), which reads the last point."""
        last_steps, last_value = self.points[-1]
        if last_steps < steps <= last_steps * (1 + OVERSHOOT):
            return last_value
        for (x0, y0), (x1, y1) in pairwise(self.points):
            if x0 <= steps <= x1:
                return y0 + (y1 - y0) * (steps - x0) / (x1 - x0)
        if len(self.points) == 1 and steps == self.points[0][0]:
            return self.points[0][1]
        return None

    @property
    def span(self) -> tuple[float, float]:
        return self.points[0][0], self.points[-1][0]


@dataclass(frozen=True)
class Held:
    """A config's measure (our metric key) and the published figures beside it."""

    metric: str
    anchors: tuple[Anchor, ...] = ()
    note: str = ""


M = 1e6

PUREJAXRL_PPO = Anchor(
    source="PureJaxRL PPO",
    reference=("PureJaxRL README, 'Minatar-Breakout' single-thread plot, 'Jax PPO' curve "
               "(luchris429/purejaxrl docs/minatar_plot_seconds.png; settings: "
               "examples/brax_minatar.ipynb, 64 envs x 128 steps, 1e7 steps), "
               "https://github.com/luchris429/purejaxrl"),
    definition=("mean training episode return (returned_episode_returns) on gymnax's "
                "Breakout-MinAtar, mean over seeds"),
    points=((0.5 * M, 15.0), (1 * M, 21.0), (2 * M, 23.0), (3 * M, 24.0), (4 * M, 26.0),
            (5 * M, 28.0), (6 * M, 31.0), (7 * M, 32.0), (8 * M, 35.0), (9 * M, 36.0),
            (10 * M, 41.0)),
    read=("the x-axis is seconds: PureJaxRL's train is one jitted scan whose metrics come "
          "back only at the end, so the curve's time is its step index scaled to the run's "
          "time; read with 0 s = 0 steps and the curve's end (about 35 s) = 1e7 steps. "
          "Digitized from the PNG's pixels (the solid orange line's mean row over +-3 "
          "pixel columns, about +-0.1M steps), axes calibrated on the tick marks; "
          "+-3 from 1M on, +-5 below 1M (the first 1M steps are 10 pixels wide)"),
)

PGX_PPO = Anchor(
    source="pgx PPO",
    reference=("pgx MinAtar PPO example, Breakout plot (sotetsuk/pgx "
               "examples/minatar-ppo/assets/breakout.png, settings in its train.py: 4096 "
               "envs x 128 steps, 3 epochs, lr 3e-4, 2e7 steps), "
               "https://github.com/sotetsuk/pgx/tree/main/examples/minatar-ppo"),
    definition=("evaluation return: mean over 100 episodes of the sampling policy after "
                "each update, on pgx's MinAtar Breakout"),
    points=((1 * M, 1.3), (2 * M, 2.5), (4 * M, 4.7), (6 * M, 6.9), (8 * M, 9.4),
            (10 * M, 13.8), (12 * M, 18.6), (15 * M, 25.6), (18 * M, 39.6),
            (19.9 * M, 49.7)),
    read=("the x-axis is seconds (JIT + training, evaluation excluded); train.py logs its "
          "first point at 0 steps after the warm-up update and each later one after an "
          "update of 524,288 steps at a constant cost, so steps are read linear in seconds "
          "from the first point (12.2 s = 0) to the last (29.7 s = 38 updates = 19.9M). "
          "Digitized from the PNG's pixels against its grid lines; +-1 below 10M, +-3 "
          "above. Far fewer updates per step than PureJaxRL's settings (38 in all), "
          "hence the slow start: shown for scale, not as the bar"),
)

MINATAR_DQN = Anchor(
    source="MinAtar paper DQN",
    reference=("Young & Tian 2019, 'MinAtar' (arXiv 1903.03176), learning curves as "
               "published in kenjyoung/MinAtar README (img/learning_curves.gif, Breakout "
               "panel, DQN curve), https://github.com/kenjyoung/MinAtar"),
    definition=("moving average of training returns over 100 episodes (epsilon-greedy), "
                "mean of 30 runs; all 6 actions, sticky actions 0.1, difficulty ramping"),
    points=((0.1 * M, 4.0), (0.25 * M, 6.7), (0.5 * M, 8.3), (0.75 * M, 8.9), (1 * M, 9.2),
            (1.5 * M, 9.4), (2 * M, 9.6), (2.5 * M, 9.8), (3 * M, 9.9), (3.5 * M, 9.9),
            (4 * M, 9.9), (4.5 * M, 10.0), (5 * M, 10.0)),
    read=("digitized from the GIF's pixels: the blue (DQN) line's mean row over +-4 pixel "
          "columns (about +-0.03M frames), axes calibrated on the tick marks "
          "(0-5M frames, 0-15 return); +-0.3, more at 0.1M where the curves overlap"),
)

JAXMARL_2S3Z_FINALS = (
    Anchor(
        source="JaxMARL report MAPPO, final",
        reference=("JaxMARL technical report (Rutherford et al. 2023, arXiv 2311.10090), "
                   "recurrent MAPPO's final 2s3z win rate, as Mava plots it "
                   "(instadeepai/Mava docs/images/smax_results/2s3z.png, dashed 'JAXMarl Rec "
                   "MAPPO' line; its SMAX benchmark page), https://github.com/instadeepai/Mava"),
        definition="final win rate after 10M env steps (the report's budget)",
        points=((10 * M, 1.0),),
        read=("the dashed line's row read off the PNG's pixels against its grid lines: "
              "100%, +-0.01; a final value only, so no figure at fewer steps"),
    ),
    Anchor(
        source="JaxMARL IPPO sweep",
        reference=("JaxMARL repository, commit 89757a6 (2024-03-21), "
                   "sweep_results/data/jaxmarl-win_rate-default-128_envs-no_agent_id.csv, "
                   "column '2s3z - win_rate' (128 envs, default settings; recurrent IPPO as "
                   "far as the commit shows: it changes baselines/IPPO/ippo_rnn_smax.py "
                   "beside the data), https://github.com/FLAIROx/JaxMARL/commit/89757a6"),
        definition=("training win rate against the heuristic enemy, mean over seeds as "
                    "exported from W&B; IPPO, not MAPPO (the report's MAPPO curve could "
                    "not be read)"),
        points=((507904, 0.0), (999424, 0.023), (1507328, 0.251), (1998848, 0.587),
                (2506752, 0.724), (2998272, 0.839), (3997696, 0.941), (4997120, 0.968),
                (5996544, 0.962), (6995968, 0.964), (7995392, 0.968), (8994816, 0.978),
                (9977856, 0.956)),
        read="copied from the CSV: the logged row nearest each step shown (exact values)",
    ),
)

PUBLISHED: dict[str, Held] = {
    "minatar_breakout_ppo": Held(RETURN, (PUREJAXRL_PPO, PGX_PPO)),
    "minatar_breakout_dqn": Held(EVAL_RETURN, (MINATAR_DQN,), note=(
        "ours is the evaluator's greedy return, the paper's the training return of an "
        "epsilon-greedy agent")),
    "smax_3m_mappo": Held(WIN_RATE, note=(
        "no published curve read: the JaxMARL report's 3m figure is an image no stored "
        "copy shows, and Mava's SMAX results leave out 3m; the bar is the issue's 0.9")),
    "smax_2s3z_mappo": Held(WIN_RATE, JAXMARL_2S3Z_FINALS, note=(
        "Mava's own recurrent MAPPO curve on the same figure is not used: its x-axis says "
        "0-1M timesteps where its text says 10M")),
    "smax_2s3z_qmix": Held(WIN_RATE, note=(
        "no published curve read: the JaxMARL report's QMIX figure is an image no stored "
        "copy shows")),
    "overcooked_cramped_room_ppo": Held(RETURN, note=(
        "no published curve read: the JaxMARL report's Overcooked figure is an image no "
        "stored copy shows; its IPPO also trains on shaped rewards, ours on soups alone")),
    "hanabi_2p_mappo": Held(RETURN, note=(
        "no published curve read: the JaxMARL report's Hanabi figure is an image no stored "
        "copy shows; JaxMARL's MAPPO config trains for 1e10 steps, far past a CPU budget")),
}
"""Config name -> its measure and published figures."""
