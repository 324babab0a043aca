"""Task files: JSONL and Parquet round trips, column mapping, ids for rows without one, and errors that name
the file and the line (or row)."""

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
    with pytest.raises(TaskFileError, match=r"empty_prompt\.jsonl:2: the prompt must be"):
        load_tasks(empty)
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}])
    with pytest.raises(TaskFileError, match=r"dup\.jsonl:2: task id 'x' already used by .*dup\.jsonl:1$"):
        load_tasks(dup)
    with pytest.raises(ValueError, match="collide"):
        save_tasks_jsonl(tmp_path / "out.jsonl", [Task("a", "p", metadata={"answer": 1})])
    assert not (tmp_path / "out.jsonl").exists()


def test_a_malformed_line_is_named_by_file_and_line_number(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "ok"}\n\n{"prompt": "a" "b"}\n')
    message = r"tasks\.jsonl:3: invalid JSON: Expecting ',' delimiter at column 16$"
    with pytest.raises(TaskFileError, match=message):
        load_tasks(path)


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_a_file_without_rows_says_it_has_no_tasks(tmp_path, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(TaskFileError, match=r"empty\.jsonl has no tasks$"):
        load_tasks(path)
    with pytest.raises(TaskFileError, match=r"empty\.jsonl has no tasks$"):
        load_tasks([write_jsonl(tmp_path / "full.jsonl", [{"prompt": "p"}]), path])


def test_a_line_that_is_not_an_object_names_the_line_and_the_expected_columns(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"question": "ok"}\n["What is 2+2?", "4"]\n')
    with pytest.raises(
        TaskFileError,
        match=r"tasks\.jsonl:2: expected an object with a prompt column 'question' \(optional: 'id', "
        r"'answer', 'tests'\), got an array \[\"What is 2\+2\?\", \"4\"\]$",
    ):
        load_tasks(path, prompt_field="question")


def test_a_later_row_without_the_prompt_column_names_its_line_and_columns(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"prompt": "ok"}, {"id": 2, "question": "q"}])
    message = r"tasks\.jsonl:2: no prompt column 'prompt'; its columns are \['id', 'question'\]"
    with pytest.raises(TaskFileError, match=message):
        load_tasks(path)


def test_json_arrays_are_read_and_their_errors_name_the_row_or_line(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"prompt": "a", "answer": 1}, {"prompt": "b", "level": 2}], indent=2))
    assert load_tasks(good) == [Task("good-0", "a", answer=1), Task("good-1", "b", metadata={"level": 2})]
    (tmp_path / "row.json").write_text('[{"prompt": "a"},\n 5]')
    with pytest.raises(TaskFileError, match=r"row\.json, row 2: expected an object .* got a number 5$"):
        load_tasks(tmp_path / "row.json")
    (tmp_path / "broken.json").write_text('[{"prompt": "a"},\n {"prompt" 5}]')
    with pytest.raises(TaskFileError, match=r"broken\.json:2: invalid JSON: Expecting ':' delimiter"):
        load_tasks(tmp_path / "broken.json")
    lines = write_jsonl(tmp_path / "lines.json", [{"prompt": "a"}, {"prompt": ""}])
    with pytest.raises(TaskFileError, match=r"lines\.json:2: the prompt must be"):
        load_tasks(lines)


def test_rows_may_differ_in_columns_and_value_types(tmp_path):
    # A table would fill the missing dict keys with None and refuse a column that changes type.
    rows = [
        {"prompt": "a", "tests": {"a.py": "x"}, "level": 1},
        {"prompt": "b", "tests": {"b.py": "y"}, "level": "hard"},
    ]
    tasks = load_tasks(write_jsonl(tmp_path / "mixed.jsonl", rows))
    assert [(t.tests, t.metadata) for t in tasks] == [
        ({"a.py": "x"}, {"level": 1}),
        ({"b.py": "y"}, {"level": "hard"}),
    ]


def test_a_parquet_error_names_the_one_based_row(tmp_path):
    from datasets import Dataset

    Dataset.from_list([{"prompt": "a"}, {"prompt": ""}]).to_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(TaskFileError, match=r"t\.parquet, row 2: the prompt must be"):
        load_tasks(tmp_path / "t.parquet")


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "latin.jsonl").write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(TaskFileError, match=r"latin\.jsonl: not UTF-8 text"):
        load_tasks(tmp_path / "latin.jsonl")
