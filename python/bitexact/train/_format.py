"""The file formats the Python trainer shares with `bitexact train`: the
trainer state's and the record's format versions, and C's ``%a`` of a
double (the hex floats of records and trainer_state.json)."""
import math

FORMAT_VERSION = 2  # trainer_state.json (train_ckpt.h TC_FORMAT_VERSION); 1 is still read
RECORD_FORMAT = 2  # a record's "record_format" (train_record.h TREC_FORMAT)


def chex(d):
    """C's ``%a`` of a double as bitexact's records write it (cli_hex):
    "nan", "inf", "-inf", else the shortest hex mantissa ("0x1p+0",
    "-0x1.8p-3", "0x0p+0")."""
    d = float(d)
    if math.isnan(d):
        return "nan"
    if math.isinf(d):
        return "inf" if d > 0 else "-inf"
    h = d.hex()  # [-]0x1.<13 hex>p<e> (or 0x0.0p+0)
    sign, h = ("-", h[1:]) if h.startswith("-") else ("", h)
    mant, exp = h[2:].split("p")
    lead, _, frac = mant.partition(".")
    frac = frac.rstrip("0")
    return f"{sign}0x{lead}{'.' + frac if frac else ''}p{exp if exp[0] in '+-' else '+' + exp}"
