"""The metrics table and its renderers: every row reads a real EngineStats attribute,
`/metrics` text parses back to the same numbers, model counters become `llmcore:model_*`
gauges, and `/slots` keeps its exact shape (llmcore's names and llama-server's)."""
import dataclasses

from llmcore import metrics as M

_NOT_NUMBERS = ("time", "status", "model", "slots", "model_stats", "replicas")


def distinct_stats(**kw) -> M.EngineStats:
    """Every numeric field a different value (ints as ints, floats as floats), so a row
    reading the wrong field shows."""
    vals = {}
    for i, f in enumerate(dataclasses.fields(M.EngineStats)):
        if f.name not in _NOT_NUMBERS:
            vals[f.name] = (i + 1) * 1.5 if f.type == "float" else i + 1
    slots = (M.SlotStats(id=0, state="idle", n_ctx=64, n_tokens=5),
             M.SlotStats(id=1, state="decode", n_ctx=64, n_tokens=9))
    return M.EngineStats(time=1.0, status="ok", model="m", slots=slots, **{**vals, **kw})


def test_table_rows_read_engine_stats_attributes():
    names = [m.name for m in M.METRICS]
    assert len(names) == len(set(names))
    fields = {f.name for f in dataclasses.fields(M.EngineStats)}
    for m in M.METRICS:
        assert m.type in ("counter", "gauge"), m
        assert m.help and m.name.startswith(("llamacpp:", "llmcore:")), m
        assert m.field in fields or isinstance(getattr(M.EngineStats, m.field), property), m
    assert set(M.DERIVED_FIELDS) == {"prompt_tokens_seconds", "predicted_tokens_seconds",
                                     "n_busy_slots_per_decode", "kv_tokens", "engines_ready"}
    assert M.FIELD_OF["llmcore:queue_length"] == M.FIELD_OF["llamacpp:requests_deferred"] == "requests_deferred"


def test_prometheus_text_parses_back_to_every_value():
    st = distinct_stats()
    text = M.to_prometheus(st)
    parsed = M.parse_prometheus(text)
    assert set(parsed) == {m.name for m in M.METRICS}
    for m in M.METRICS:
        assert parsed[m.name] == float(getattr(st, m.field)), m.name
        assert f"# TYPE {m.name} {m.type}\n" in text and f"# HELP {m.name} {m.help}\n" in text
    assert parsed["llamacpp:kv_cache_tokens"] == 14  # derived: the slots' tokens
    assert parsed["llamacpp:prompt_tokens_seconds"] == st.prompt_tokens_total / st.prompt_seconds_total
    assert f"llmcore:requests_total {st.requests_total}\n" in text  # ints print as ints


def test_to_dict_has_every_value_the_table_reads():
    st = distinct_stats()
    d = st.to_dict()
    for m in M.METRICS:
        assert d[m.field] == getattr(st, m.field), m.field
    assert d["model_stats"] == {} and [s["id"] for s in d["slots"]] == [0, 1]


def test_model_stats_are_model_gauges():
    st = distinct_stats(model_stats={"experts_computed": 120, "experts_skipped": 8.5, "odd-name x": 1,
                                     "label": "not a number"})
    text = M.to_prometheus(st)
    parsed = M.parse_prometheus(text)
    assert parsed["llmcore:model_experts_computed"] == 120 and parsed["llmcore:model_experts_skipped"] == 8.5
    assert parsed["llmcore:model_odd_name_x"] == 1
    assert "# TYPE llmcore:model_experts_computed gauge\n" in text
    assert not any("label" in k for k in parsed)
    assert M.model_stat_key("llmcore:model_experts_skipped") == "experts_skipped"
    assert M.model_stat_key("llmcore:requests_total") is None
    assert not any(k.startswith(M.MODEL_STAT_PREFIX) for k in M.parse_prometheus(M.to_prometheus(distinct_stats())))


def test_parse_prometheus_skips_what_it_cannot_read():
    text = "# HELP a x\na 1\nb{le=\"0.5\"} 2.5\nbad line here\nc NaNish\nd 3 1700000000\n\n  e -Inf \n"
    assert M.parse_prometheus(text) == {"a": 1.0, 'b{le="0.5"}': 2.5, "d": 3.0, "e": float("-inf")}


def test_slots_json_shape():
    busy = M.SlotStats(id=1, state="decode", n_ctx=100, n_tokens=9, task_id=4, n_prompt=5, n_cached=2,
                       n_prefilled=3, n_decoded=6, prompt_per_second=1.5, predicted_per_second=2.5,
                       t_last_used=3.0, nbytes=11, cache_source="ram", n_checkpoints=2, checkpoint_bytes=99)
    idle = M.SlotStats(id=0, state="idle", n_ctx=100, n_tokens=7)
    out = M.slots_json(M.EngineStats(slots=(idle, busy)))
    assert out[1] == {
        "id": 1, "n_ctx": 100, "is_processing": True, "state": "decode", "id_task": 4, "n_tokens": 9,
        "n_prompt": 5, "n_cached": 2, "n_prefilled": 3, "n_decoded": 6, "prompt_per_second": 1.5,
        "predicted_per_second": 2.5, "nbytes": 11, "t_last_used": 3.0,
        "n_prompt_tokens": 5, "n_prompt_tokens_cache": 2, "n_prompt_tokens_processed": 3,
        "next_token": [{"has_next_token": True, "n_decoded": 6}],
        "cache_source": "ram", "n_checkpoints": 2, "checkpoint_bytes": 99,
    }
    assert out[0]["id_task"] == -1 and out[0]["is_processing"] is False
    assert out[0]["next_token"] == [{"has_next_token": False, "n_decoded": 0}]
