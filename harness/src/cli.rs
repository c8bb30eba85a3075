//! The examples' command lines, parsed the same way by every example: named flags only.
//!
//! A flag has a long name (`--repeats`) and may have a short one (`-r`); a flag that takes a value gets it from the
//! next word or after `=` (`--repeats 5`, `--repeats=5`). `-h` or `--help` prints the example's usage on stdout and
//! exits 0. Anything else wrong (a word that is no flag of the example, a missing or bad value, a flag given twice,
//! a flag the run would ignore) prints `NAME: <what is wrong, naming the argument>` and `try NAME --help` on stderr
//! and exits 2. Nothing here panics on user input.

/// One flag an example accepts.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// `--name`.
    pub long: &'static str,
    /// `-n`, if the flag has a short form.
    pub short: Option<&'static str>,
    /// Whether a value follows.
    pub takes_value: bool,
}

impl Flag {
    /// A flag that takes no value (`--pin`).
    pub const fn switch(long: &'static str, short: Option<&'static str>) -> Flag {
        Flag { long, short, takes_value: false }
    }

    /// A flag followed by a value (`--repeats 5`).
    pub const fn value(long: &'static str, short: Option<&'static str>) -> Flag {
        Flag { long, short, takes_value: true }
    }
}

/// One flag as given on the command line.
#[derive(Clone, Debug)]
struct Given {
    /// The flag's long name, whatever the spelling.
    long: &'static str,
    /// As the user wrote it (`-g` or `--groups`), for messages.
    spelled: String,
    value: Option<String>,
}

/// The flags of one command line, each at most once.
#[derive(Clone, Debug, Default)]
pub struct Args {
    given: Vec<Given>,
}

/// What a command line asks for.
#[derive(Debug)]
pub enum Parsed {
    /// `-h` or `--help`: print the usage and exit 0.
    Help,
    /// A run with these flags.
    Run(Args),
}

/// Parses `words` (the arguments after the program name) against `flags`. Stops at `-h`/`--help`.
pub fn parse(flags: &[Flag], words: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut args = Args::default();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        if word == "-h" || word == "--help" {
            return Ok(Parsed::Help);
        }
        // `--flag=value`; a short flag never takes `=`.
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (word.as_str(), None),
        };
        let Some(flag) = flags.iter().find(|f| f.long == name || f.short == Some(name)) else {
            return Err(if word.starts_with('-') && word.len() > 1 {
                format!("unknown argument {word:?}")
            } else {
                format!("unexpected argument {word:?}: every option is a named flag (--help lists them)")
            });
        };
        if let Some(first) = args.given.iter().find(|g| g.long == flag.long) {
            return Err(if first.spelled == name {
                format!("{name} given twice")
            } else {
                format!("{} and {name} are the same flag, given twice", first.spelled)
            });
        }
        let value = match (flag.takes_value, inline) {
            (false, None) => None,
            (false, Some(_)) => return Err(format!("{name} takes no value (got {word:?})")),
            (true, Some(v)) => Some(v),
            (true, None) => Some(words.next().ok_or_else(|| format!("{name} needs a value"))?),
        };
        args.given.push(Given { long: flag.long, spelled: name.to_string(), value });
    }
    Ok(Parsed::Run(args))
}

impl Args {
    fn find(&self, long: &str) -> Option<&Given> {
        self.given.iter().find(|g| g.long == long)
    }

    /// Whether the flag `long` was given (in either spelling).
    pub fn has(&self, long: &str) -> bool {
        self.find(long).is_some()
    }

    /// The flag `long` as the user wrote it (its long name if it was not given).
    pub fn spelled<'a>(&'a self, long: &'a str) -> &'a str {
        self.find(long).map_or(long, |g| g.spelled.as_str())
    }

    /// The value of the flag `long`, if given.
    pub fn value(&self, long: &str) -> Option<&str> {
        self.find(long).and_then(|g| g.value.as_deref())
    }

    /// The value of `long` converted by `convert`, whose error (what was expected) is prefixed with the flag as
    /// written and followed by the value: `-g: expected a positive integer, got "x"`.
    pub fn get<T>(&self, long: &str, convert: impl FnOnce(&str) -> Result<T, String>) -> Result<Option<T>, String> {
        match self.value(long) {
            None => Ok(None),
            Some(v) => convert(v).map(Some).map_err(|e| format!("{}: {e}, got {v:?}", self.spelled(long))),
        }
    }

    /// The value of `long` as an integer of at least 1.
    pub fn positive(&self, long: &str) -> Result<Option<usize>, String> {
        self.get(long, |v| v.parse::<usize>().ok().filter(|&n| n >= 1).ok_or("expected a positive integer".into()))
    }

    /// The value of `long` as a 64-bit integer of at least 1.
    pub fn positive_u64(&self, long: &str) -> Result<Option<u64>, String> {
        self.get(long, |v| v.parse::<u64>().ok().filter(|&n| n >= 1).ok_or("expected a positive integer".into()))
    }

    /// The value of `long` as a number of seconds, fractions allowed: finite, above 0 and at most a day (86400).
    pub fn seconds(&self, long: &str) -> Result<Option<f64>, String> {
        self.get(long, |v| {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                .ok_or_else(|| "expected a number of seconds in (0, 86400]".to_string())
        })
    }

    /// An error naming `long` as written if it was given although `applies` is false: the run would ignore it.
    /// `when` says when it applies (`"with --compare"`).
    pub fn only(&self, long: &str, applies: bool, when: &str) -> Result<(), String> {
        match self.find(long) {
            Some(g) if !applies => Err(format!("{} applies only {when}", g.spelled)),
            _ => Ok(()),
        }
    }
}

/// The command line of example `name`, built into its configuration by `build`: on `--help` prints `usage` on
/// stdout and exits 0; on any error (from the words, the parser or `build`) prints it with a hint on stderr and
/// exits 2.
pub fn parse_or_exit<T>(name: &str, usage: &str, flags: &[Flag], build: impl FnOnce(&Args) -> Result<T, String>) -> T {
    match super::args().and_then(|words| parse(flags, words)) {
        Ok(Parsed::Help) => {
            super::write_out(format_args!("{}\n", usage.trim_end()));
            std::process::exit(0);
        }
        Ok(Parsed::Run(args)) => build(&args).unwrap_or_else(|e| usage_error(name, &e)),
        Err(e) => usage_error(name, &e),
    }
}

/// Prints a command-line error of example `name` and exits 2.
pub fn usage_error(name: &str, e: &str) -> ! {
    super::errln!("{name}: {e}\ntry {name} --help");
    std::process::exit(2);
}

/// What `build` makes of `words` (`None` for `--help`): [`parse_or_exit`] without the exits, for the examples' tests.
pub fn parse_words<T>(
    flags: &[Flag],
    words: &[&str],
    build: impl FnOnce(&Args) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match parse(flags, words.iter().map(|w| w.to_string()))? {
        Parsed::Help => Ok(None),
        Parsed::Run(args) => build(&args).map(Some),
    }
}

/// Whether `usage` lists every flag of `flags` (`-s, --long` for one with a short form) and mentions no `--word`
/// that is neither a flag nor `--help`; for the examples' tests.
pub fn check_usage(usage: &str, flags: &[Flag]) -> Result<(), String> {
    for f in flags {
        let listed = match f.short {
            Some(short) => format!("{short}, {}", f.long),
            None => f.long.to_string(),
        };
        if !usage.contains(&listed) {
            return Err(format!("the usage does not list {listed}"));
        }
    }
    let words = usage.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
    match words
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .find(|w| *w != "--help" && !flags.iter().any(|f| f.long == *w))
    {
        Some(w) => Err(format!("the usage mentions {w}, which is no flag")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[
        Flag::value("--groups", Some("-g")),
        Flag::value("--repeats", None),
        Flag::switch("--pipe", Some("-p")),
        Flag::switch("--compare", None),
    ];

    fn run(words: &[&str]) -> Result<Args, String> {
        match parse(FLAGS, words.iter().map(|w| w.to_string()))? {
            Parsed::Run(args) => Ok(args),
            Parsed::Help => Err("help".into()),
        }
    }

    /// Values after a space or `=`, short and long spellings, switches; absent flags are absent.
    #[test]
    fn named_flags_with_values_and_switches() {
        let a = run(&["-g", "4", "--repeats=5", "-p"]).unwrap();
        assert_eq!((a.value("--groups"), a.value("--repeats")), (Some("4"), Some("5")));
        assert!(a.has("--pipe") && !a.has("--compare"));
        assert_eq!(a.spelled("--groups"), "-g");
        assert_eq!(a.spelled("--compare"), "--compare");
        assert_eq!(a.positive("--groups"), Ok(Some(4)));
        assert_eq!(a.positive("--compare"), Ok(None));
        // A value may start with '-' or contain '=': it is the next word, or everything after the first '='.
        let a = run(&["--groups", "-1", "--repeats=a=b"]).unwrap();
        assert_eq!((a.value("--groups"), a.value("--repeats")), (Some("-1"), Some("a=b")));
        assert!(run(&[]).unwrap().given.is_empty());
    }

    /// `-h` and `--help` stop the parse wherever they come, unless they are a flag's value.
    #[test]
    fn help_anywhere() {
        assert!(matches!(parse(FLAGS, ["-h".to_string()]), Ok(Parsed::Help)));
        let words = ["-g", "2", "--help", "--bogus"].map(String::from);
        assert!(matches!(parse(FLAGS, words), Ok(Parsed::Help)));
        assert_eq!(run(&["--repeats", "--help"]).unwrap().value("--repeats"), Some("--help"));
    }

    /// Every error names the argument that caused it.
    #[test]
    fn errors_name_the_argument() {
        for (words, want) in [
            (&["--bogus"][..], r#"unknown argument "--bogus""#),
            (&["-x"], r#"unknown argument "-x""#),
            (&["-g4"], r#"unknown argument "-g4""#),
            (&["5"], r#"unexpected argument "5": every option is a named flag"#),
            (&["-"], r#"unexpected argument "-""#),
            (&["--groups"], "--groups needs a value"),
            (&["-g"], "-g needs a value"),
            (&["--pipe=1"], r#"--pipe takes no value (got "--pipe=1")"#),
            (&["--repeats", "1", "--repeats", "2"], "--repeats given twice"),
            (&["-g", "1", "--groups=2"], "-g and --groups are the same flag, given twice"),
            (&["--pipe", "-p"], "--pipe and -p are the same flag, given twice"),
        ] {
            let e = run(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
    }

    /// The usage must list each flag as `-s, --long` or `--long`, and mention no other `--word` but `--help`.
    #[test]
    fn usage_check() {
        let usage = "  -g, --groups N\n      --repeats N\n  -p, --pipe\n      --compare (or --bogus)\n  -h, --help";
        assert_eq!(check_usage(&usage.replace(" (or --bogus)", ""), FLAGS), Ok(()));
        assert_eq!(check_usage(usage, FLAGS), Err("the usage mentions --bogus, which is no flag".into()));
        let e = check_usage("--groups --repeats -p --pipe --compare", FLAGS).unwrap_err();
        assert_eq!(e, "the usage does not list -g, --groups");
    }

    /// Conversions name the flag as written and the value; `only` names the flag and when it applies.
    #[test]
    fn values_and_applicability() {
        let a = run(&["-g", "0", "--repeats", "x"]).unwrap();
        assert_eq!(a.positive("--groups"), Err(r#"-g: expected a positive integer, got "0""#.into()));
        assert_eq!(a.positive_u64("--repeats"), Err(r#"--repeats: expected a positive integer, got "x""#.into()));
        let big = run(&["--repeats", "18446744073709551616"]).unwrap();
        assert!(big.positive_u64("--repeats").is_err());
        let a = run(&["--repeats", "18446744073709551615"]).unwrap();
        assert_eq!(a.positive_u64("--repeats"), Ok(Some(u64::MAX)));
        assert_eq!(a.get("--repeats", |v| Ok::<_, String>(v.len())), Ok(Some(20)));
        assert_eq!(a.only("--repeats", false, "with --compare"), Err("--repeats applies only with --compare".into()));
        assert_eq!(a.only("--repeats", true, "with --compare"), Ok(()));
        assert_eq!(a.only("--groups", false, "with --compare"), Ok(()), "not given: nothing to ignore");
        let a = run(&["-g", "0.05", "--repeats", "0"]).unwrap();
        assert_eq!(a.seconds("--groups"), Ok(Some(0.05)));
        assert_eq!(
            a.seconds("--repeats"),
            Err(r#"--repeats: expected a number of seconds in (0, 86400], got "0""#.into())
        );
        for bad in ["-1", "NaN", "inf", "86401", "x"] {
            assert!(run(&["-g", bad]).unwrap().seconds("--groups").is_err(), "{bad}");
        }
        assert_eq!(run(&["-g", "86400"]).unwrap().seconds("--groups"), Ok(Some(86_400.0)));
    }
}
