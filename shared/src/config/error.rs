//! Configuration errors: each one names the file, line and column it comes from.

use std::fmt;
use std::path::PathBuf;

/// One problem in a configuration file.
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the whole file (e.g. it cannot be read).
    pub line: usize,
    pub col: usize,
    pub kind: ConfigErrorKind,
}

#[derive(Debug)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Read(std::io::Error),
    /// RON syntax, a wrong type, an unknown key or a bad value (ron stops at the first).
    Syntax(ron::Error),
    /// A value that is well-formed but wrong, or wrong together with others.
    Invalid { field: String, message: String },
}

/// Every error found in one configuration file, in file order.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file.display(), self.line, self.col)?;
        match &self.kind {
            ConfigErrorKind::Read(e) => write!(f, "cannot read configuration file: {e}"),
            ConfigErrorKind::Syntax(e) => write!(f, "{e}"),
            ConfigErrorKind::Invalid { field, message } => write!(f, "{field}: {message}"),
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
impl std::error::Error for ConfigErrors {}
