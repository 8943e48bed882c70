"""Every "Note [Name] in place" names a place that writes the note: notes
move with their code (issue 40 moved a dozen), and a reference left behind
sends a reader to a file that does not explain it."""
from tests.conftest import REPO_ROOT
from tests.docs.note_references import broken_references, definitions


def test_every_note_reference_names_the_file_that_writes_the_note():
    assert len(definitions(REPO_ROOT)) >= 80   # the check reads the notes at all
    assert broken_references(REPO_ROOT) == []


def test_the_check_itself_can_fail(tmp_path):
    (tmp_path / "tensile_tf").mkdir()
    (tmp_path / "tensile_tf" / "a.py").write_text('"""\nNote [Moved away]\nWhy.\n"""\n')
    (tmp_path / "tensile_tf" / "b.py").write_text("# see Note [Moved away] in tensile_tf/b.py\n"
                                                 "# and Note [Moved away] in tensile_tf.a\n")
    assert broken_references(tmp_path) == [("tensile_tf/b.py", "Moved away", "tensile_tf/b.py", {"tensile_tf/a.py"})]
