"""The Student t quantile in pure Python, for the metric's confidence interval.

Every eval session computes one t quantile per metric at its end. Importing
scipy.special for it costs about 0.35 s of CPU and 37 MiB per session (it
drags in numpy.f2py and array_api_compat), more than the rest of a small
run. Here the quantile is solved in decimal arithmetic at 50 digits: Hill's
(1970, CACM algorithm 396) approximation as the start, then Newton steps on
the upper tail, which is half a regularized incomplete beta function
(Lentz's continued fraction, Stirling's series for the log-gamma function).
The result is the 50-digit root rounded once to a float, so it is the
correctly rounded quantile; scipy's (Boost's) agrees with it to within an ulp
or two (tests/test_student_t.py compares the two across degrees of freedom
1 to 10^6).
"""

from __future__ import annotations

import functools
import math
from decimal import Context, Decimal, localcontext

_DIGITS = 50
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459")
# B_2k / (2k (2k - 1)) for k = 1..15: the coefficients of Stirling's series.
_STIRLING = [
    Decimal(num) / Decimal(den)
    for num, den in [
        (1, 12),
        (-1, 360),
        (1, 1260),
        (-1, 1680),
        (1, 1188),
        (-691, 360360),
        (1, 156),
        (-3617, 122400),
        (43867, 244188),
        (-174611, 125400),
        (77683, 5796),
        (-236364091, 1506960),
        (657931, 300),
        (-3392780147, 93960),
        (1723168255201, 2492028),
    ]
]


# Kept per (df, p): every metric of a task asks the same quantile (a task's
# instances are its degrees of freedom), and one costs about 10 ms here.
@functools.lru_cache(maxsize=64)
def t_quantile(df: float, p: float) -> float:
    """The p-quantile of Student's t distribution with `df` degrees of
    freedom (what scipy.special.stdtrit(df, p) computes), correctly rounded.

    Raises ValueError for df < 1, a non-finite df or p outside (0, 1).
    """
    if not (math.isfinite(df) and df >= 1):
        raise ValueError(f"degrees of freedom must be a finite number >= 1, got {df!r}")
    if not 0 < p < 1:
        raise ValueError(f"p must be between 0 and 1, got {p!r}")
    if p == 0.5:
        return 0.0
    with localcontext(Context(prec=_DIGITS)):
        # The tail beyond the quantile, exactly as the decimal of p says.
        tail = Decimal(p) if p < 0.5 else 1 - Decimal(p)
        t = _solve(Decimal(df), tail, _hill(float(df), 2 * float(tail)))
    return -float(t) if p < 0.5 else float(t)


def _hill(n: float, p2: float) -> float:
    """Hill's approximation of the t quantile for two-tailed probability p2."""
    if n == 1:
        return 1 / math.tan(p2 * math.pi / 2)
    if n == 2:
        return math.sqrt(2 / (p2 * (2 - p2)) - 2)
    a = 1 / (n - 0.5)
    b = 48 / (a * a)
    c = ((20700 * a / b - 98) * a - 16) * a + 96.36
    d = ((94.5 / (b + c) - 3) / b + 1) * math.sqrt(a * math.pi / 2) * n
    x = d * p2
    y = x ** (2 / n)
    if y > 0.05 + a:
        x = _normal_lower_quantile(p2 / 2)
        y = x * x
        if n < 5:
            c += 0.3 * (n - 4.5) * (x + 0.6)
        c = (((0.05 * d * x - 5) * x - 7) * x - 2) * x + b + c
        y = (((((0.4 * y + 6.3) * y + 36) * y + 94.5) / c - y - 3) / b + 1) * x
        y = math.expm1(a * y * y)
    else:
        inner = 1 / (((n + 6) / (n * y) - 0.089 * d - 0.822) * (n + 2) * 3) + 0.5 / (n + 4)
        y = (inner * y - 1) * (n + 1) / (n + 2) + 1 / y
    return math.sqrt(n * y) if y > 0 else 1e-8


def _normal_lower_quantile(q: float) -> float:
    """The lower normal quantile for Hill's start: Abramowitz and Stegun's
    26.2.23, then Newton steps on erfc, in double precision."""
    w = math.sqrt(-2 * math.log(q))
    numerator = 2.515517 + 0.802853 * w + 0.010328 * w * w
    x = -w + numerator / (1 + 1.432788 * w + 0.189269 * w * w + 0.001308 * w**3)
    for _ in range(3):
        err = 0.5 * math.erfc(-x / math.sqrt(2)) - q
        x -= err * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
    return x


def _solve(df: Decimal, tail: Decimal, start: float) -> Decimal:
    """Newton's method on upper_tail(t) = tail, in decimal arithmetic."""
    half = Decimal("0.5")
    a = df / 2
    # log of the density's constant: Gamma((df+1)/2) / (sqrt(df pi) Gamma(df/2)).
    log_norm = _lgamma(a + half) - _lgamma(a) - (df * _PI).ln() / 2
    log_beta = _lgamma(a) + _lgamma(half) - _lgamma(a + half)
    t = Decimal(repr(start))
    tol = Decimal(10) ** (-(_DIGITS - 8))
    for _ in range(100):
        density = (log_norm - (a + half) * (1 + t * t / df).ln()).exp()
        step = (_upper_tail(df, t, log_beta) - tail) / density
        # Keep t positive: the tail is below one half, so the root is.
        t = t + step if t + step > 0 else t / 2
        if abs(step) <= tol * t:
            break
    return t


def _upper_tail(df: Decimal, t: Decimal, log_beta: Decimal) -> Decimal:
    """P(T > t) for t > 0: half the regularized incomplete beta
    I_x(df/2, 1/2) at x = df / (df + t^2)."""
    half = Decimal("0.5")
    a = df / 2
    t2 = t * t
    x = df / (df + t2)
    y = t2 / (df + t2)
    if x < (a + 1) / (a + Decimal("2.5")):
        return _ibeta_cf(a, half, x, y, log_beta) / 2
    return (1 - _ibeta_cf(half, a, y, x, log_beta)) / 2


def _ibeta_cf(a: Decimal, b: Decimal, x: Decimal, y: Decimal, log_beta: Decimal) -> Decimal:
    """I_x(a, b), y = 1 - x, by Lentz's continued fraction (converges fast
    for x < (a + 1) / (a + b + 2)); log_beta is log B(a, b)."""
    tiny = Decimal(10) ** -(3 * _DIGITS)
    tol = Decimal(10) ** -(_DIGITS - 4)
    front = (a * x.ln() + b * y.ln() - log_beta).exp() / a
    f = c = Decimal(1)
    d = Decimal(0)
    for i in range(100_000):
        m = i // 2
        if i == 0:
            numerator = Decimal(1)
        elif i % 2 == 0:
            numerator = (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + numerator * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + numerator / c
        c = c if abs(c) > tiny else tiny
        cd = c * d
        f *= cd
        if abs(1 - cd) < tol:
            break
    return front * (f - 1)


def _lgamma(z: Decimal) -> Decimal:
    """log Gamma(z) for z > 0: shifted up to 40, then Stirling's series."""
    product = Decimal(1)
    while z < 40:
        product *= z
        z += 1
    series = Decimal(0)
    power = z
    z2 = z * z
    for coefficient in _STIRLING:
        series += coefficient / power
        power *= z2
    return (z - Decimal("0.5")) * z.ln() - z + (2 * _PI).ln() / 2 + series - product.ln()
