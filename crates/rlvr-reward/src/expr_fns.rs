//! The functions and Greek letters the expression parser ([`crate::expr::parse_expr`]) knows, and
//! their evaluation.

/// The elementary functions [`crate::expr::parse_expr`] reads (`\sin`, ..., `\arctan`, `\ln`, `\log`, `\exp`);
/// `\sin^{-1}` is read as `\arcsin`, `\log_b x` as `\ln x / \ln b`, `\log x` as the natural log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// sine
    Sin,
    /// cosine
    Cos,
    /// tangent
    Tan,
    /// secant
    Sec,
    /// cosecant
    Csc,
    /// cotangent
    Cot,
    /// arcsine
    Asin,
    /// arccosine
    Acos,
    /// arctangent
    Atan,
    /// natural logarithm
    Ln,
    /// absolute value `|x|`
    Abs,
    /// exponential
    Exp,
}

impl Func {
    pub(crate) fn from_name(name: &str) -> Option<Func> {
        Some(match name {
            "sin" => Func::Sin,
            "cos" => Func::Cos,
            "tan" => Func::Tan,
            "sec" => Func::Sec,
            "csc" | "cosec" => Func::Csc,
            "cot" => Func::Cot,
            "arcsin" => Func::Asin,
            "arccos" => Func::Acos,
            "arctan" => Func::Atan,
            "ln" | "log" => Func::Ln,
            "exp" => Func::Exp,
            _ => return None,
        })
    }
    pub(crate) fn inverse(self) -> Option<Func> {
        match self {
            Func::Sin => Some(Func::Asin),
            Func::Cos => Some(Func::Acos),
            Func::Tan => Some(Func::Atan),
            _ => None,
        }
    }
    pub(crate) fn apply(self, x: f64) -> f64 {
        match self {
            Func::Sin => x.sin(),
            Func::Cos => x.cos(),
            Func::Tan => x.tan(),
            Func::Sec => 1.0 / x.cos(),
            Func::Csc => 1.0 / x.sin(),
            Func::Cot => 1.0 / x.tan(),
            Func::Asin => x.asin(),
            Func::Acos => x.acos(),
            Func::Atan => x.atan(),
            Func::Ln => x.ln(),
            Func::Abs => x.abs(),
            Func::Exp => x.exp(),
        }
    }
}

/// Greek letters read as variables (each its own unknown).
pub(crate) fn greek(name: &str) -> Option<char> {
    const NAMES: &[(&str, char)] = &[
        ("alpha", 'α'),
        ("beta", 'β'),
        ("gamma", 'γ'),
        ("delta", 'δ'),
        ("epsilon", 'ε'),
        ("varepsilon", 'ε'),
        ("theta", 'θ'),
        ("vartheta", 'θ'),
        ("lambda", 'λ'),
        ("mu", 'μ'),
        ("rho", 'ρ'),
        ("sigma", 'σ'),
        ("tau", 'τ'),
        ("phi", 'φ'),
        ("varphi", 'φ'),
        ("psi", 'ψ'),
        ("omega", 'ω'),
    ];
    NAMES.iter().find(|(n, _)| *n == name).map(|&(_, c)| c)
}
