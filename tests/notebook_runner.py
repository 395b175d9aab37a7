"""Executing notebooks under notebooks/ in a fresh kernel (nbclient)."""

from pathlib import Path


def execute_notebook(path, cwd, timeout=600):
    """Runs every cell of the notebook at `path` with `cwd` as working directory.

    The kernel is the `python3` kernel of this environment and is shut down
    afterwards, also on failure. Returns the executed notebook (outputs filled in);
    raises `nbclient.exceptions.CellExecutionError` naming the failing cell.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(Path(path), as_version=4)
    client = NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return notebook


def cell_text(notebook) -> str:
    """All stream and text outputs of an executed notebook, joined."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output.get("text", ""))
            elif "data" in output and "text/plain" in output["data"]:
                parts.append(output["data"]["text/plain"])
    return "".join(parts)
