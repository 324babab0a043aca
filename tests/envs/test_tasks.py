"""Task files: JSONL and Parquet round trips, column mapping, ids for rows without one, clear errors."""

from __future__ import annotations

import json

import pytest

from sao.envs.base import Task
from sao.envs.tasks import TaskFileError, load_tasks, save_tasks_jsonl

TASKS = [
    Task("t1", "What is 2+2?", answer="4", metadata={"level": 1, "source": "toy"}),
    Task(
        "t2",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse 'abc'."}],
        answer="cba",
        tests={"hidden_test.py": "assert f() == 'cba'\n"},
        metadata={"level": 3, "source": "toy"},
    ),
    Task("t3", "Say hi.", metadata={"level": 2}),
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_round_trip_keeps_prompts_answers_tests_and_metadata(tmp_path):
    save_tasks_jsonl(tmp_path / "tasks.jsonl", TASKS)
    assert load_tasks(tmp_path / "tasks.jsonl") == TASKS


def test_parquet_round_trip_through_datasets(tmp_path):
    from datasets import Dataset

    rows = [
        {"id": "p1", "prompt": "first", "answer": "1", "difficulty": "easy"},
        {"id": "p2", "prompt": "second", "answer": "2", "difficulty": "hard"},
    ]
    Dataset.from_list(rows).to_parquet(str(tmp_path / "tasks.parquet"))
    loaded = load_tasks(str(tmp_path / "tasks.parquet"))
    assert loaded == [
        Task("p1", "first", answer="1", metadata={"difficulty": "easy"}),
        Task("p2", "second", answer="2", metadata={"difficulty": "hard"}),
    ]
    save_tasks_jsonl(tmp_path / "again.jsonl", loaded)
    assert load_tasks(tmp_path / "again.jsonl") == loaded


def test_parquet_with_message_prompts_drops_the_keys_a_table_fills_with_none(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompts = [
        [{"role": "user", "content": "a", "name": None}],
        [{"role": "tool", "content": "b", "name": "calc"}],
    ]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "msgs.parquet")
    loaded = load_tasks(tmp_path / "msgs.parquet")
    assert [t.prompt for t in loaded] == [
        [{"role": "user", "content": "a"}],
        [{"role": "tool", "content": "b", "name": "calc"}],
    ]


def test_field_mapping_and_missing_ids_and_limit_over_several_files(tmp_path):
    a = write_jsonl(
        tmp_path / "alpha.jsonl", [{"question": "q0", "gold": 7, "cases": [1]}, {"question": "q1"}]
    )
    b = write_jsonl(tmp_path / "beta.jsonl", [{"question": "q2", "gold": "x", "key": "k"}])
    kw = dict(prompt_field="question", answer_field="gold", tests_field="cases", id_field="key")
    tasks = load_tasks([a, b], **kw)
    assert [t.id for t in tasks] == ["alpha-0", "alpha-1", "k"]
    assert [(t.prompt, t.answer, t.tests) for t in tasks] == [
        ("q0", 7, [1]),
        ("q1", None, None),
        ("q2", "x", None),
    ]
    assert all(t.metadata == {} for t in tasks)
    assert [t.id for t in load_tasks([a, b], limit=2, **kw)] == ["alpha-0", "alpha-1"]


def test_a_missing_prompt_column_names_the_file_and_its_columns(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"id": "1", "question": "q", "answer": "a"}])
    with pytest.raises(TaskFileError, match=r"bad\.jsonl.*'prompt'.*\['answer', 'id', 'question'\]"):
        load_tasks(path)


def test_bad_files_and_rows_are_errors_that_name_them(tmp_path):
    with pytest.raises(TaskFileError, match="does not exist"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "tasks.csv").write_text("prompt\nq\n")
    with pytest.raises(TaskFileError, match="unknown task file format"):
        load_tasks(tmp_path / "tasks.csv")
    empty = write_jsonl(tmp_path / "empty_prompt.jsonl", [{"prompt": "ok"}, {"prompt": ""}])
    with pytest.raises(TaskFileError, match=r"empty_prompt\.jsonl, row 1: the prompt must be"):
        load_tasks(empty)
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}])
    with pytest.raises(TaskFileError, match="task id 'x' already used"):
        load_tasks(dup)
    with pytest.raises(ValueError, match="collide"):
        save_tasks_jsonl(tmp_path / "out.jsonl", [Task("a", "p", metadata={"answer": 1})])
    assert not (tmp_path / "out.jsonl").exists()
