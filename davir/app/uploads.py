"""The image input of the app: Gradio's Image component that hands the uploaded file over untouched.

Gradio's own Image opens every upload with PIL before the app sees it, so a file that is not an image, or one
too large to decode safely, would fail with Gradio's message. `UploadedImage` passes the uploaded file's path
on instead, and the captioner's loader (davir.data.images.load_rgb, as in `caption.py`) reads it or says what
is wrong with it. In the browser it is Gradio's Image (`is_template`: the same front-end component).
"""

from __future__ import annotations

from davir.errors import import_optional

gr = import_optional("gradio", needed_by="davir-app")  # not a dependency of davir: the extra davir[app]


class UploadedImage(gr.Image):
    """gr.Image's own constructor (Gradio serialises the component from its signature): use `image_input`."""

    is_template = True  # Gradio draws it with its parent's front end (gr.Image)

    def preprocess(self, payload):
        """The uploaded file's path (in Gradio's upload folder, under the name it was uploaded with), or None."""
        if payload is None:
            return None
        if getattr(payload, "url", None) and str(payload.url).startswith("data:"):  # a pasted image: decoded
            return super().preprocess(payload)
        return payload.path


def image_input(label: str, **kwargs) -> UploadedImage:
    """An upload box for one image of the pair, handing its file over untouched."""
    return UploadedImage(label=label, type="filepath", sources=["upload", "clipboard"], image_mode=None, **kwargs)
