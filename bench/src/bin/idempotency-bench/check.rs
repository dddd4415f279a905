//! `--check`: the figures a run measured, held to the performance goals
//! (budgets overridable by flag), one verdict per goal. A goal whose figure
//! the run did not measure is "not measured", never a pass; only a goal
//! measured and missed fails the run.

use std::fmt;

/// The waiter count the memory goal is stated for.
pub(crate) const GOAL_WAITERS: usize = 10_000;

/// The goals, each with its default budget (`docs/performance.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    WalBytes,
    Commits,
    PostgresCpu,
    ServerCpu,
    CycleOverLimit,
    WaitersRss,
    ReplayServerCpu,
}

impl Goal {
    pub(crate) const ALL: [Goal; 7] = [
        Goal::WalBytes,
        Goal::Commits,
        Goal::PostgresCpu,
        Goal::ServerCpu,
        Goal::CycleOverLimit,
        Goal::WaitersRss,
        Goal::ReplayServerCpu,
    ];

    /// What the figure is, for its line.
    fn describe(self) -> &'static str {
        match self {
            Goal::WalBytes => "cycle: WAL bytes per cycle",
            Goal::Commits => "cycle: commits per cycle",
            Goal::PostgresCpu => "cycle: PostgreSQL CPU per cycle, µs",
            Goal::ServerCpu => "cycle: server CPU per cycle, µs",
            Goal::CycleOverLimit => "cycle ÷ limit",
            Goal::WaitersRss => "wait: server resident MiB with 10,000 waiters",
            Goal::ReplayServerCpu => "replay: server CPU per call, µs",
        }
    }

    /// Higher is better for the ratio; lower for every cost.
    fn at_least(self) -> bool {
        self == Goal::CycleOverLimit
    }

    /// The scenario and flags that measure it, for a figure not measured.
    fn how(self) -> &'static str {
        match self {
            Goal::WalBytes | Goal::Commits => "`cycle` with --database-url",
            Goal::PostgresCpu => "`cycle`",
            Goal::ServerCpu => "`cycle` with --server-pid",
            Goal::CycleOverLimit => "`limit` after a `cycle`",
            Goal::WaitersRss => "`wait` with --waiters 10000 and --server-pid",
            Goal::ReplayServerCpu => "`replay` with --server-pid",
        }
    }
}

/// The budgets `--check` holds the figures to.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct Budgets {
    /// `--check`: most WAL bytes per `cycle`.
    #[arg(long, default_value_t = 530.0)]
    pub(crate) budget_wal_bytes: f64,
    /// `--check`: most commits per `cycle`.
    #[arg(long, default_value_t = 0.25)]
    pub(crate) budget_commits: f64,
    /// `--check`: most PostgreSQL CPU per `cycle`, in µs.
    #[arg(long, default_value_t = 120.0)]
    pub(crate) budget_postgres_cpu_us: f64,
    /// `--check`: most server CPU per `cycle`, in µs.
    #[arg(long, default_value_t = 70.0)]
    pub(crate) budget_server_cpu_us: f64,
    /// `--check`: least ratio of `cycle` to `limit` (the median of a run's
    /// ratios).
    #[arg(long, default_value_t = 1.3)]
    pub(crate) budget_cycle_over_limit: f64,
    /// `--check`: most server resident memory with 10,000 waiters parked
    /// (`wait --waiters 10000 --server-pid`), in MiB.
    #[arg(long, default_value_t = 48.0)]
    pub(crate) budget_waiters_rss_mib: f64,
    /// `--check`: most server CPU per `replay` call, in µs.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) budget_replay_server_cpu_us: f64,
}

impl Budgets {
    fn of(&self, goal: Goal) -> f64 {
        match goal {
            Goal::WalBytes => self.budget_wal_bytes,
            Goal::Commits => self.budget_commits,
            Goal::PostgresCpu => self.budget_postgres_cpu_us,
            Goal::ServerCpu => self.budget_server_cpu_us,
            Goal::CycleOverLimit => self.budget_cycle_over_limit,
            Goal::WaitersRss => self.budget_waiters_rss_mib,
            Goal::ReplayServerCpu => self.budget_replay_server_cpu_us,
        }
    }
}

/// Every figure of a run that a goal is about, each scenario's run adding
/// its own (a run that alternates `cycle` and `limit` adds several).
#[derive(Debug, Default, Clone)]
pub(crate) struct Measured {
    figures: Vec<(Goal, f64)>,
}

impl Measured {
    pub(crate) fn add(&mut self, goal: Goal, figure: f64) {
        if figure.is_finite() {
            self.figures.push((goal, figure));
        }
    }

    fn of(&self, goal: Goal) -> Vec<f64> {
        self.figures
            .iter()
            .filter(|(g, _)| *g == goal)
            .map(|(_, f)| *f)
            .collect()
    }
}

/// A goal's figures in one run: their median, held to the budget, and
/// their spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Figure {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) runs: usize,
}

fn figure(mut values: Vec<f64>) -> Option<Figure> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Some(Figure {
        median,
        min: values[0],
        max: values[n - 1],
        runs: n,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Pass,
    Fail,
    NotMeasured,
}

/// One goal's verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Verdict {
    pub(crate) goal: Goal,
    pub(crate) figure: Option<Figure>,
    pub(crate) budget: f64,
    pub(crate) outcome: Outcome,
}

/// Every goal's verdict on `measured`, in the order of [`Goal::ALL`].
pub(crate) fn judge(measured: &Measured, budgets: &Budgets) -> Vec<Verdict> {
    Goal::ALL
        .iter()
        .map(|&goal| {
            let budget = budgets.of(goal);
            let figure = figure(measured.of(goal));
            let outcome = match figure {
                None => Outcome::NotMeasured,
                Some(f) if goal.at_least() && f.median >= budget => Outcome::Pass,
                Some(f) if !goal.at_least() && f.median <= budget => Outcome::Pass,
                Some(_) => Outcome::Fail,
            };
            Verdict {
                goal,
                figure,
                budget,
                outcome,
            }
        })
        .collect()
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let goal = self.goal;
        let sign = if goal.at_least() { "≥" } else { "≤" };
        let decimals = match goal {
            Goal::Commits | Goal::CycleOverLimit => 3,
            Goal::WaitersRss => 1,
            _ => 0,
        };
        let budget = self.budget;
        let outcome = match self.outcome {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::NotMeasured => "not measured",
        };
        write!(f, "check: {}: ", goal.describe())?;
        match self.figure {
            None => write!(f, "- (run {})", goal.how())?,
            Some(fig) if fig.runs == 1 => write!(f, "{:.decimals$}", fig.median)?,
            Some(fig) => write!(
                f,
                "{:.decimals$} (median of {}, {:.decimals$}–{:.decimals$})",
                fig.median, fig.runs, fig.min, fig.max
            )?,
        }
        write!(f, "; budget {sign} {budget:.decimals$}: {outcome}")
    }
}

/// Prints one line per goal and returns whether every goal measured met its
/// budget.
pub(crate) fn report(measured: &Measured, budgets: &Budgets) -> bool {
    let verdicts = judge(measured, budgets);
    for verdict in &verdicts {
        println!("{verdict}");
    }
    let missed: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.outcome == Outcome::Fail)
        .map(|v| v.goal.describe())
        .collect();
    if missed.is_empty() {
        println!("check: every goal measured met its budget");
        true
    } else {
        println!("check: goals missed: {}", missed.join("; "));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Budgets {
        Budgets {
            budget_wal_bytes: 530.0,
            budget_commits: 0.25,
            budget_postgres_cpu_us: 120.0,
            budget_server_cpu_us: 70.0,
            budget_cycle_over_limit: 1.3,
            budget_waiters_rss_mib: 48.0,
            budget_replay_server_cpu_us: 20.0,
        }
    }

    fn outcome(verdicts: &[Verdict], goal: Goal) -> Outcome {
        verdicts.iter().find(|v| v.goal == goal).unwrap().outcome
    }

    #[test]
    fn a_goal_not_measured_is_reported_as_such_and_fails_nothing() {
        let verdicts = judge(&Measured::default(), &defaults());
        assert_eq!(verdicts.len(), Goal::ALL.len());
        assert!(verdicts.iter().all(|v| v.outcome == Outcome::NotMeasured));
        assert!(verdicts[0].to_string().ends_with("not measured"));
        assert!(report(&Measured::default(), &defaults()));
    }

    #[test]
    fn costs_pass_at_or_under_their_budget_and_fail_above_it() {
        let mut measured = Measured::default();
        measured.add(Goal::WalBytes, 530.0);
        measured.add(Goal::Commits, 0.43);
        measured.add(Goal::PostgresCpu, 119.0);
        measured.add(Goal::ServerCpu, 230.0);
        measured.add(Goal::WaitersRss, 61.5);
        measured.add(Goal::ReplayServerCpu, 19.9);
        let verdicts = judge(&measured, &defaults());
        assert_eq!(outcome(&verdicts, Goal::WalBytes), Outcome::Pass);
        assert_eq!(outcome(&verdicts, Goal::Commits), Outcome::Fail);
        assert_eq!(outcome(&verdicts, Goal::PostgresCpu), Outcome::Pass);
        assert_eq!(outcome(&verdicts, Goal::ServerCpu), Outcome::Fail);
        assert_eq!(
            outcome(&verdicts, Goal::CycleOverLimit),
            Outcome::NotMeasured
        );
        assert_eq!(outcome(&verdicts, Goal::WaitersRss), Outcome::Fail);
        assert_eq!(outcome(&verdicts, Goal::ReplayServerCpu), Outcome::Pass);
        assert!(!report(&measured, &defaults()));
    }

    #[test]
    fn the_ratio_to_the_limit_is_the_median_of_the_alternations_and_must_reach_its_budget() {
        let mut measured = Measured::default();
        for ratio in [0.99, 1.40, 1.31] {
            measured.add(Goal::CycleOverLimit, ratio);
        }
        let verdicts = judge(&measured, &defaults());
        let ratio = verdicts[4];
        assert_eq!(ratio.goal, Goal::CycleOverLimit);
        assert_eq!(
            ratio.figure,
            Some(Figure {
                median: 1.31,
                min: 0.99,
                max: 1.40,
                runs: 3
            })
        );
        assert_eq!(ratio.outcome, Outcome::Pass);
        assert_eq!(
            ratio.to_string(),
            "check: cycle ÷ limit: 1.310 (median of 3, 0.990–1.400); budget ≥ 1.300: pass"
        );
        measured.add(Goal::CycleOverLimit, 1.0);
        let verdicts = judge(&measured, &defaults());
        assert_eq!(outcome(&verdicts, Goal::CycleOverLimit), Outcome::Fail);
    }

    #[test]
    fn budgets_given_by_flag_replace_the_goals() {
        let mut measured = Measured::default();
        measured.add(Goal::WaitersRss, 61.5);
        let loose = Budgets {
            budget_waiters_rss_mib: 64.0,
            ..defaults()
        };
        assert_eq!(
            outcome(&judge(&measured, &loose), Goal::WaitersRss),
            Outcome::Pass
        );
    }

    #[test]
    fn figures_that_are_not_numbers_are_not_measurements() {
        let mut measured = Measured::default();
        measured.add(Goal::ServerCpu, f64::NAN);
        assert_eq!(
            outcome(&judge(&measured, &defaults()), Goal::ServerCpu),
            Outcome::NotMeasured
        );
    }
}
