"""The conversation's `Turn` model is a message (one per question and per answer): renamed `Message`, so the only
`Turn` in the code is the gateway's request lifecycle."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("visualizer", "0001_initial"),
    ]

    operations = [
        migrations.RenameModel(old_name="Turn", new_name="Message"),
        migrations.AlterField(
            model_name="message",
            name="conversation",
            field=models.ForeignKey(
                on_delete=models.deletion.CASCADE, related_name="messages", to="visualizer.conversation"
            ),
        ),
    ]
