"""Argument checks shared by the model constructors; each failure is one ConfigError line."""

from tessel.errors import ConfigError

SOFTMAX_CHOICES = ("full", "sampled")


def check_int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} is {value!r}; it must be an integer >= {low}")
    return value


def check_dropout(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"dropout is {value!r}; it must be in [0, 1)")
    return float(value)


def check_softmax(softmax, num_sampled, vocab_size: int) -> None:
    if softmax not in SOFTMAX_CHOICES:
        raise ConfigError(f"softmax is {softmax!r}; valid: {', '.join(SOFTMAX_CHOICES)}")
    if softmax == "sampled":
        check_int("num_sampled", num_sampled)
        if num_sampled >= vocab_size:
            raise ConfigError(f"num_sampled is {num_sampled}; it must be < vocab_size ({vocab_size}), "
                              "or use softmax 'full'")
